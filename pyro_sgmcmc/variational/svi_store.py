"""Pyro's parameter store around a fit: the global parameter mode and one private store per fit.

Every entry point of :mod:`pyro_sgmcmc.variational.svi` that calls a guide
(:func:`~pyro_sgmcmc.variational.svi.fit_svi`,
:meth:`~pyro_sgmcmc.variational.svi.SVIResult.sample_posterior`,
:func:`~pyro_sgmcmc.variational.svi.full_data_negative_elbo`) runs under :func:`global_param_mode`,
and every fit keeps its guide's parameters in its own store (:func:`_param_scope`), so that
independent fits of one model do not share parameters and the user's store is left alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import pyro

__all__ = ["global_param_mode"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


def global_param_mode(fn: Callable[_P, _T]) -> Callable[_P, _T]:
    """Run ``fn`` with ``pyro.settings`` ``module_local_params=False``: any PyroModule works.

    Pyro's ``PyroModule`` keeps a ``_Context`` that creates its private ``param_state`` only if
    ``module_local_params`` is on *when the module is built*, but reads the setting again every
    time the module is *called* (``_Context.__enter__``). A model built with the setting off
    and called with it on (set globally by the user, or by a caller's
    ``pyro.settings.context``) fails with ``AttributeError: '_Context' object has no attribute
    'param_state'``. With the setting off at call time a module works however it was built
    (the context never touches ``param_state`` then), and the per-fit store scope of
    :func:`_param_scope` already gives the isolation that module-local parameters would.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with pyro.settings.context(module_local_params=False):
            return fn(*args, **kwargs)

    return wrapper


def _param_scope(state: dict | None = None) -> Any:
    """A private parameter store for one fit (``ParamStoreDict.scope``).

    Independent fits of the same model create guides whose parameters have the same names; in
    Pyro's global parameter mode (see :func:`global_param_mode`) a ``PyroModule`` guide reads
    its parameters from the global store by name, so each fit keeps its own store state and
    every call of its guide runs inside it. The user's global store is restored on exit.
    """
    return pyro.get_param_store().scope(state)
