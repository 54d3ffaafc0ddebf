r"""A network's outputs as its verdict judges them: a classifier's as class probabilities (the
link its likelihood applies), a training set's at the rows its run judged.

A network is judged on its outputs :math:`f(x)` (:mod:`.function_space`). A classifier's outputs
are usually logits, and logits are not what the model predicts: a softmax is unchanged by a shift
:math:`f_k(x) + c(x)` of every class, so the logits of a chain can drift along that direction
(held only by the prior) while its predictions have converged, and the rank diagnostics of a
logit and of its class's probability differ (softmax mixes the classes). What a classifier
predicts, and what its verdict judges, is

.. math::

    p(y = k \mid x) = \operatorname{softmax}_k f(x)
    \quad\text{or}\quad p(y = 1 \mid x) = \sigma(f(x)).

:func:`output_link` finds that link from one trace of the model: its outputs are logits when
the class probabilities of its observation (a ``Categorical``, ``OneHotCategorical`` or
``Multinomial`` site) equal their softmax (``Bernoulli`` or ``Binomial``: their sigmoid),
whether the site was given ``logits=f`` or ``probs=softmax(f)``. Outputs that already are
probabilities (a model ending in ``return pyro.sample("obs", dist.Categorical(logits=f),
obs=y)``, whose outputs are its observation's class probabilities) or a regression's outputs
have no link.
The run's verdict, the export (its posterior's attribute ``output_link``) and
:func:`~pyro_sgmcmc.convergence_report` apply the same :func:`apply_link`; the export's
``output`` stays what the model returns.

A network run without a test set is judged at up to 64 training rows
(:class:`~.function_space.OutputDraws`); its export stores the outputs at every row and records
the rows judged, which :func:`judged_outputs` selects, so that the report on the export says
what the run said.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
import torch
import xarray as xr
from pyro import poutine
from pyro.poutine.subsample_messenger import _Subsample

from .export_trace import _WRAPPERS, OUTPUT, returned_output

__all__ = ["LINKS", "apply_link", "judged_outputs", "output_link", "traced_output_link"]

#: The links a classifier's outputs may have, by the name the export records.
LINKS = ("softmax", "sigmoid")

_SOFTMAX_SITES = (
    torch.distributions.Categorical,
    torch.distributions.OneHotCategorical,
    torch.distributions.Multinomial,
)
_SIGMOID_SITES = (torch.distributions.Bernoulli, torch.distributions.Binomial)


def output_link(trace: poutine.Trace, latents: Collection[str] = ()) -> str | None:
    """The link (``"softmax"`` or ``"sigmoid"``) that turns the traced model's outputs (its
    site ``output``, or its return value) into the class probabilities of one of its sample
    sites other than ``latents`` -- its observations, observed or (on test inputs without
    targets) drawn -- or ``None`` where no such site's probabilities are those of the
    outputs."""
    site = trace.nodes.get(OUTPUT)
    output = site["value"] if site is not None else returned_output(trace, latents)
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or not output.numel():
        return None
    candidates = _at_observed_rows(trace, output.detach())
    for name, node in trace.nodes.items():
        if node["type"] != "sample" or name in latents:  # observed, or drawn (test inputs)
            continue
        if node["infer"].get("_deterministic", False):
            continue
        for candidate in candidates:
            link = _link_of(node["fn"], candidate)
            if link is not None:
                return link
    return None


def _at_observed_rows(trace: poutine.Trace, output: torch.Tensor) -> list[torch.Tensor]:
    """``output`` as it is and, where it holds every row while a plate of the trace draws some
    (``f = net(x)`` then ``obs=y[idx]`` with ``f[idx]``), at each plate's rows."""
    candidates = [output]
    for node in trace.nodes.values():
        rows = node["value"] if isinstance(node.get("fn"), _Subsample) else None
        if isinstance(rows, torch.Tensor) and rows.dim() == 1 and rows.numel() and output.dim():
            if len(rows) < output.shape[0] and int(rows.max()) < output.shape[0]:
                candidates.append(output.index_select(0, rows.to(output.device)))
    return candidates


def _link_of(fn: Any, output: torch.Tensor) -> str | None:
    """The link under which ``output`` gives ``fn``'s class probabilities, if one does."""
    base = fn
    while isinstance(base, _WRAPPERS):
        base = base.base_dist
    if isinstance(base, _SOFTMAX_SITES):
        link, candidate = "softmax", output.softmax(-1)
    elif isinstance(base, _SIGMOID_SITES):
        link, candidate = "sigmoid", output.sigmoid()
    else:
        return None
    probs = base.probs.detach()
    if probs.numel() != candidate.numel():
        return None
    if link == "softmax" and probs.shape[-1:] != candidate.shape[-1:]:  # the classes
        return None
    if _close(output, probs):  # the outputs are the probabilities (e.g. uniform ones)
        return None
    return link if _close(candidate, probs) else None


def _close(values: torch.Tensor, probs: torch.Tensor) -> bool:
    return torch.allclose(
        values.reshape(probs.shape).double(), probs.double(), rtol=1e-4, atol=1e-6
    )


def traced_output_link(
    model: Callable[..., Any],
    latents: Mapping[str, torch.Tensor],
    args: tuple,
    kwargs: Mapping[str, Any],
) -> str | None:
    """:func:`output_link` of one run of ``model(*args, **kwargs)`` conditioned on the
    constrained ``latents`` of one draw."""
    with torch.no_grad():
        trace = poutine.trace(poutine.condition(model, data=dict(latents))).get_trace(
            *args, **kwargs
        )
    return output_link(trace, latents)


def apply_link(values: np.ndarray, link: str | None) -> np.ndarray:
    """``values`` (float, the classes on the last axis for ``"softmax"``) as class
    probabilities under ``link``; as they are for ``None``."""
    if link is None:
        return values
    if link not in LINKS:
        raise ValueError(f"link must be one of {LINKS} or None, got {link!r}")
    tensor = torch.from_numpy(np.asarray(values, dtype=np.float64))
    probabilities = tensor.softmax(-1) if link == "softmax" else tensor.sigmoid()
    return probabilities.numpy()


def judged_outputs(
    dataset: xr.Dataset, attrs: Mapping[str, Any], at_judged_rows: bool
) -> xr.Dataset:
    """A network's outputs ``output`` of ``dataset`` as its run judged them: with
    ``at_judged_rows``, at the training rows of the export's attributes ``judged_rows`` of
    ``judged_of_rows`` (where the outputs are at every row of those data), and under the link
    of its attribute ``output_link`` (a classifier's class probabilities)."""
    output = dataset.data_vars.get(OUTPUT)
    if output is None:
        return dataset
    rows = attrs.get("judged_rows")
    if at_judged_rows and rows is not None and output.ndim >= 3:
        row_dim = output.dims[2]  # (chain, draw, row, ...)
        if dataset.sizes[row_dim] == int(attrs.get("judged_of_rows", -1)):
            dataset = dataset.isel({row_dim: np.atleast_1d(np.asarray(rows, dtype=int))})
            output = dataset[OUTPUT]
    link = attrs.get("output_link")
    if link is None:
        return dataset
    return dataset.assign({OUTPUT: output.copy(data=apply_link(output.values, str(link)))})
