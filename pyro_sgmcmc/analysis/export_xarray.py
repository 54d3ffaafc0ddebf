"""Arrays to labelled ``xarray.Dataset`` groups: dimension names, the plate axis, argument names.

The lowest layer of the export (:mod:`pyro_sgmcmc.analysis.export`): every group of the result is
built here from NumPy arrays, with ``chain``/``draw`` leading dimensions where the variable has
draws, ``<name>_dim_<k>`` for the other dimensions unless ``dims`` names them or a plate spans
them (the plate's name; the data plate's on the axis of the rows). It also names a model's
positional arguments (for ``constant_data`` and for error messages). It imports nothing from
the rest of the export.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from .._validation import model_signature

__all__: list[str] = []


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _numpy_dict(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each value of ``variables`` (tensor or array-like) as a NumPy array."""
    return {name: _numpy(value) for name, value in variables.items()}


def _default_dims(name: str, ndim: int, start: int = 0) -> list[str]:
    return [f"{name}_dim_{k}" for k in range(start, start + ndim)]


def _dataset(
    variables: Mapping[str, np.ndarray],
    leading: Sequence[str],
    dims: Mapping[str, Sequence[str]],
    attrs: Mapping[str, Any] | None = None,
    axis_names: Mapping[str, Mapping[int, str]] | None = None,
) -> xr.Dataset:
    """An xarray dataset; ``axis_names[var][k]`` names axis ``k`` (after the leading dims)."""
    data_vars = {}
    for name, array in variables.items():
        array = np.asarray(array)
        ndim = array.ndim - len(leading)
        if name in dims:
            names = list(dims[name])
            if len(names) != ndim:
                raise ValueError(
                    f"dims[{name!r}] must name {ndim} dimensions (shape "
                    f"{array.shape[len(leading) :]}), got {names}"
                )
        else:
            names = _default_dims(name, ndim)
            for axis, axis_name in (axis_names or {}).get(name, {}).items():
                names[axis] = axis_name
        data_vars[name] = (list(leading) + names, array)
    dataset = xr.Dataset(data_vars)
    # integer coordinates on every dimension, as ArviZ's own converters give them: selections
    # and ArviZ 1.x's plots (arviz_plots' rank plots) need one on each
    dataset = dataset.assign_coords({dim: np.arange(size) for dim, size in dataset.sizes.items()})
    dataset.attrs.update(attrs or {})
    return dataset


def _batch_dims(
    dims: Mapping[str, Sequence[str]], values: Mapping[str, np.ndarray | list[np.ndarray]]
) -> dict[str, list[str]]:
    """``dims`` of observed sites for their pointwise log-likelihoods, whose event dimensions
    are summed: the leading (batch) names of each."""
    return {
        name: list(dims[name])[: values[name][0].ndim] if len(values[name]) else list(dims[name])
        for name in values
        if name in dims
    }


def _draws_dataset(
    values: Mapping[str, np.ndarray | list[np.ndarray]],
    num_chains: int,
    num_draws: int,
    dims: Mapping[str, Sequence[str]],
    attrs: Mapping[str, Any],
    axis_names: Mapping[str, Mapping[int, str]],
) -> xr.Dataset:
    """A ``(chain, draw, ...)`` dataset of per-draw values listed in chain-major order."""
    return _dataset(
        {name: _reshape_draws(v, num_chains, num_draws) for name, v in values.items()},
        ("chain", "draw"),
        dims,
        attrs,
        axis_names,
    )


def _reshape_draws(
    values: np.ndarray | list[np.ndarray], num_chains: int, num_draws: int
) -> np.ndarray:
    """``(chain, draw, ...)`` from per-draw values in chain-major order: an array with the
    draws on its first axis (reshaped, not copied) or a list of per-draw arrays."""
    stacked = values if isinstance(values, np.ndarray) else np.stack(values)
    return stacked.reshape((num_chains, num_draws, *stacked.shape[1:]))


def _axis_names(
    plate_axis: Mapping[str, int | None],
    dim_name: str,
    other_plates: Mapping[str, Mapping[int, str]] | None = None,
) -> dict[str, dict[int, str]]:
    """Per variable, its axes named after plates: the data plate's axis ``plate_axis[name]``
    named ``dim_name``, and the axes of ``other_plates[name]`` after their plates."""
    names = {name: dict(axes) for name, axes in (other_plates or {}).items()}
    for name, axis in plate_axis.items():
        if axis is not None:
            names.setdefault(name, {})[axis] = dim_name
    return names


def _leading_plate_axis(
    variables: Mapping[str, np.ndarray], num_rows: int, plate_name: str
) -> dict[str, dict[int, str]]:
    return {
        name: {0: plate_name}
        for name, value in variables.items()
        if value.ndim >= 1 and value.shape[0] == num_rows
    }


def _argument_names(model: Callable[..., Any], num_args: int) -> list[str]:
    signature = model_signature(model)
    params = [] if signature is None else list(signature.parameters.values())
    names = []
    for k in range(num_args):
        if k < len(params) and params[k].kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            names.append(params[k].name)
        else:
            names.append(f"arg{k}")
    return names


def _tensor_arguments(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    named = dict(zip(_argument_names(model, len(args)), args, strict=True))
    named.update(kwargs)
    return {name: _numpy(v) for name, v in named.items() if isinstance(v, torch.Tensor)}
