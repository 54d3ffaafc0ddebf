r"""The one module that knows which ArviZ line is installed: 0.x or 1.x.

ArviZ 1.x splits ArviZ into ``arviz_base`` (data), ``arviz_stats`` (diagnostics, LOO) and
``arviz_plots`` (figures), and stores a result as an ``xarray.DataTree`` whose children are the
groups that an ArviZ 0.x ``InferenceData`` holds. The rest of the package reads and writes results
only through the functions below, each with one implementation per line, so that it runs
unchanged with either. Under 0.x every function does exactly what the package did before this
module existed. The module is one job, kept whole so that each operation's two implementations
sit side by side. ArviZ itself is imported when it is first used (importing it takes about two
seconds, which a script that only samples need not wait for).

=========================  ================================  ===================================
operation                  ArviZ 0.x                         ArviZ 1.x
=========================  ================================  ===================================
:func:`from_datasets`      ``az.InferenceData(**groups)``    ``xarray.DataTree.from_dict``
:func:`from_samples`       ``az.from_dict(posterior=...)``   ``az.from_dict({"posterior": ...})``
:func:`group_names`        ``idata.groups()``                ``list(tree.children)``
:func:`get_group`          ``getattr(idata, name)``          ``tree[name].to_dataset()``
:func:`set_group`          ``setattr`` / ``idata[name] =``   ``tree[name] = dataset``
:func:`concat_chains`      ``az.concat(..., dim="chain")``   ``xarray.concat`` per group
:func:`to_netcdf`          ``idata.to_netcdf``               ``tree.to_netcdf`` (h5netcdf, zlib)
:func:`load_netcdf`        ``az.from_netcdf``                ``xarray.open_datatree``, loaded
:func:`rhat`, :func:`ess`  :mod:`.rank_diagnostics`          the same (ArviZ's numbers)
:func:`loo`                ``elpd_loo``, ``p_loo``,          ``elpd``, ``p``, ``elpd_i``
                           ``loo_i``                         (one :class:`Loo` for both)
:func:`compare`            ``elpd_loo``, ``p_loo``,          ``elpd``, ``p``, ``elpd_diff <= 0``
                           ``elpd_diff >= 0``                (kept; 0.x's renamed, negated)
:func:`bfmi`               an array per chain                a ``Dataset`` (``energy``)
:func:`plot_trace`, ...    draws into given axes             ``arviz_plots`` ``PlotCollection``
=========================  ================================  ===================================

Notes
-----
The tail ESS of ArviZ 0.x is the smaller ESS of the 5% and 95% quantiles (Vehtari et al. 2021);
ArviZ 1.x takes the quantiles from ``rcParams["stats.ci_prob"]`` (0.89 by default, i.e. 5.5% and
94.5%). :func:`ess` computes bulk and tail ESS itself (0.x's quantiles): they, and the verdicts
of :mod:`pyro_sgmcmc.analysis.diagnostics`, mean the same under both. :func:`summary` is ArviZ's
own and keeps each line's columns and defaults (0.x: ``hdi_3%``/``hdi_97%``; 1.x: ``eti89_lb``/
``eti89_ub`` and a tail ESS at the 0.89 interval).

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter and P.-C. Bürkner, "Rank-normalization, folding,
and localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2),
2021.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from . import rank_diagnostics
from .rank_diagnostics import TAIL_PROB

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ARVIZ_1",
    "SAMPLE_DIMS",
    "TAIL_PROB",
    "InferenceData",
    "Loo",
    "bfmi",
    "check_result",
    "compare",
    "concat_chains",
    "ess",
    "from_datasets",
    "from_samples",
    "get_group",
    "group_names",
    "has_group",
    "load_netcdf",
    "loo",
    "mcse",
    "plot_energy",
    "plot_rank",
    "plot_trace",
    "rhat",
    "set_group",
    "summary",
    "to_netcdf",
]


class _OnFirstUse:
    """A module imported when one of its attributes is first read: ArviZ takes about two
    seconds to import (SciPy's statistics, its plotting), which a script that only samples, and
    the command line's ``--help``, need not wait for."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(import_module(self._name), attribute)


az: Any = _OnFirstUse("arviz")


def _arviz_version() -> str:
    """The installed ArviZ's version, from its metadata (without importing it) where it has
    some."""
    try:
        return metadata.version("arviz")
    except metadata.PackageNotFoundError:
        return az.__version__


#: ``True`` under ArviZ 1.x (``DataTree`` results), ``False`` under 0.x (``InferenceData``).
ARVIZ_1: bool = int(_arviz_version().split(".")[0]) >= 1


#: The dimensions that index draws in every group that holds draws.
SAMPLE_DIMS: tuple[str, str] = ("chain", "draw")

if TYPE_CHECKING:
    InferenceData: Any  # read through the module's ``__getattr__``


def __getattr__(name: str) -> Any:
    """``InferenceData``: the class of a result, ``xarray.DataTree`` under ArviZ 1.x (not
    ``az.InferenceData``, there an alias of it that warns on access), ArviZ's own under 0.x."""
    if name == "InferenceData":
        return xr.DataTree if ARVIZ_1 else az.InferenceData
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# building and reading results
# ---------------------------------------------------------------------------------------------
def from_datasets(groups: Mapping[str, xr.Dataset]) -> Any:
    """A result object whose groups are the given datasets, kept as they are.

    Parameters
    ----------
    groups : mapping of str to xarray.Dataset
        Group name (``posterior``, ..., or a custom one such as ``svi_loss``) to its dataset,
        kept as it is; one without variables is left out, as ArviZ 0.x's ``InferenceData`` does.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        An ``InferenceData`` under ArviZ 0.x, a ``DataTree`` with one child per group under 1.x.
    """
    if ARVIZ_1:
        return xr.DataTree.from_dict({f"/{n}": d for n, d in groups.items() if d.data_vars})
    with warnings.catch_warnings():
        # 0.x warns about groups outside its schema (svi_loss), which are kept all the same
        warnings.filterwarnings("ignore", message=".*svi_loss.*")
        return az.InferenceData(**groups)


def from_samples(posterior: Mapping[str, Any], **groups: Mapping[str, Any]) -> Any:
    """A result built from arrays of draws (``az.from_dict``).

    Parameters
    ----------
    posterior : mapping of str to array_like
        Variable name to draws of shape ``(chain, draw, ...)``; the other dimensions are named
        ``<name>_dim_<k>``.
    **groups : mapping of str to array_like
        Other groups the same way (``predictions={"output": ...}``); ``observed_data`` and
        ``constant_data`` without ``chain`` and ``draw``.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
    """
    arrays = {
        name: {key: np.asarray(values) for key, values in variables.items()}
        for name, variables in {"posterior": posterior, **groups}.items()
    }
    if ARVIZ_1:
        return az.from_dict(arrays)
    return az.from_dict(**arrays)


def check_result(idata: Any, argument: str = "idata") -> None:
    """Refuse anything but a whole result: an ``arviz.InferenceData`` (ArviZ 0.x) or the root of
    an ``xarray.DataTree`` (1.x), naming what was given instead.

    Raises
    ------
    TypeError
        For another type (a file's path: load it first), or for one group of a result.
    """
    expected = "an xarray.DataTree" if ARVIZ_1 else "an arviz.InferenceData"
    if not isinstance(idata, xr.DataTree if ARVIZ_1 else az.InferenceData):
        hint = ""
        if isinstance(idata, (str, os.PathLike)):
            hint = f"; for a file, load it first: {argument} = az.from_netcdf(path)"
        raise TypeError(
            f"{argument} must be {expected} (e.g. from to_inference_data), got "
            f"{type(idata).__name__}{hint}"
        )
    if ARVIZ_1 and idata.parent is not None and not idata.children:  # a result may be nested
        raise TypeError(
            f"{argument} is the group {idata.name!r} of a result, not the result: pass the whole "
            "tree (ArviZ 1.x's az.thin(idata) returns the posterior group alone; thin a result "
            "with idata.isel(draw=slice(None, None, k)))"
        )


def group_names(idata: Any) -> list[str]:
    """The names of the groups of a result, in their order (``posterior`` first when present).

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree

    Returns
    -------
    list of str
    """
    if ARVIZ_1:
        return list(idata.children)
    return list(idata.groups())


def has_group(idata: Any, name: str) -> bool:
    """Whether the result has the group ``name``.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    name : str

    Returns
    -------
    bool
    """
    return name in group_names(idata)


def get_group(idata: Any, name: str) -> xr.Dataset:
    """One group of a result as an ``xarray.Dataset``.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    name : str
        The group.

    Returns
    -------
    xarray.Dataset
        Under 0.x the group itself; under 1.x a dataset built from the node (its variables and
        attributes are shared with the tree, but the dataset's ``attrs`` mapping is its own: use
        ``idata[name].attrs`` or :func:`set_group` to change the result).

    Raises
    ------
    KeyError
        If the result has no such group.
    """
    if not has_group(idata, name):
        raise KeyError(f"no group {name!r}; the groups are {group_names(idata)}")
    if ARVIZ_1:
        return idata[name].to_dataset()
    return getattr(idata, name)


def set_group(idata: Any, name: str, dataset: xr.Dataset) -> None:
    """Add the group ``name`` to a result, or replace it, in place.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    name : str
    dataset : xarray.Dataset
    """
    if ARVIZ_1:
        idata[name] = dataset
    elif has_group(idata, name):
        setattr(idata, name, dataset)
    else:
        idata[name] = dataset


def concat_chains(*results: Any) -> Any:
    """Results of the same model joined along ``chain``, chains renumbered ``0, 1, ...``.

    Parameters
    ----------
    *results : arviz.InferenceData or xarray.DataTree
        Two or more results with the same groups and draws per chain.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        Every group with a ``chain`` dimension concatenated; a group without one (observed
        data, constant data) and the attributes taken from the first result.
    """
    if len(results) < 2:
        raise ValueError(f"concat_chains needs two or more results, got {len(results)}")
    drawn = [n for n in group_names(results[0]) if "draw" in get_group(results[0], n).dims]
    draws = [get_group(result, drawn[0]).sizes.get("draw") for result in results] if drawn else []
    if len(set(draws)) > 1:  # ArviZ 1.x's xarray would pad the shorter with NaN
        raise ValueError(
            f"concat_chains needs the same number of draws per chain in every result, got "
            f"{', '.join(map(str, draws))}: cut them to the shortest first, e.g. "
            f"result.isel(draw=slice(0, {min(draws)}))"
        )
    if not ARVIZ_1:
        return az.concat(*results, dim="chain")
    groups = {}
    for name in group_names(results[0]):
        first = get_group(results[0], name)
        if "chain" not in first.dims:
            groups[name] = first
            continue
        joined = xr.concat(
            [get_group(result, name) for result in results],
            dim="chain",
            data_vars="all",
            coords="different",
            compat="equals",
            join="outer",
            combine_attrs="override",
        )
        groups[name] = joined.assign_coords(chain=np.arange(joined.sizes["chain"]))
    return from_datasets(groups)


# ---------------------------------------------------------------------------------------------
# netCDF
# ---------------------------------------------------------------------------------------------
def _compressible(variable: xr.Variable) -> bool:
    return variable.dtype.kind in "biufcS"


def to_netcdf(idata: Any, path: str | os.PathLike) -> str:
    """Write a result to a netCDF-4 file, one HDF5 group per group, numeric variables compressed.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    path : str or path-like

    Returns
    -------
    str
        The path written.
    """
    path = str(path)
    if not ARVIZ_1:
        return idata.to_netcdf(path)
    encoding = {
        f"/{name}": {
            key: {"zlib": True}
            for key, variable in get_group(idata, name).variables.items()
            if _compressible(variable)
        }
        for name in group_names(idata)
    }
    idata.to_netcdf(path, engine="h5netcdf", encoding=encoding)
    return path


def load_netcdf(path: str | os.PathLike) -> Any:
    """Read a result written by :func:`to_netcdf` (or by ArviZ).

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        Under 0.x ``az.from_netcdf`` (lazy or not as ``az.rcParams["data.load"]`` says); under
        1.x read into memory and the file closed (as ``xarray.load_datatree`` does).
    """
    if ARVIZ_1:
        # what xarray.load_datatree does, in xarray versions that predate it too
        with xr.open_datatree(str(path)) as tree:
            return tree.load()
    return az.from_netcdf(str(path))


def to_zarr(idata: Any, path: str | os.PathLike) -> str:
    """Write a result to a Zarr store (a directory), one Zarr group per group; needs ``zarr``.

    Both lines write through ``xarray.DataTree.to_zarr``, so either line reads the store back
    with :func:`load_zarr`.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    path : str or path-like
        A directory that does not exist yet (an existing store is not overwritten).

    Returns
    -------
    str
        The path written.
    """
    _needs_zarr()
    path = str(path)
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists: give a new path for the Zarr store")
    groups = {f"/{name}": get_group(idata, name) for name in group_names(idata)}
    # without consolidated metadata, which Zarr format 3 does not specify (zarr warns)
    xr.DataTree.from_dict(groups).to_zarr(path, mode="w-", consolidated=False)
    return path


def load_zarr(path: str | os.PathLike) -> Any:
    """Read a result written by :func:`to_zarr`, into memory, as the installed line's object.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
    """
    _needs_zarr()
    with xr.open_datatree(str(path), engine="zarr", consolidated=False) as tree:
        groups = {name: child.to_dataset().load() for name, child in tree.children.items()}
    return from_datasets(groups)


def _needs_zarr() -> None:
    try:
        import zarr  # noqa: F401
    except ImportError as error:
        raise ImportError("Zarr stores need the zarr package: pip install zarr") from error


# ---------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------
def rhat(dataset: xr.Dataset) -> xr.Dataset:
    r"""Rank-normalised split :math:`\hat R` of every variable of a dataset: ArviZ's numbers (both
    lines), computed for every scalar at once (:mod:`.rank_diagnostics`).

    Parameters
    ----------
    dataset : xarray.Dataset
        Variables with ``chain`` and ``draw`` dimensions (two chains, four draws or more).

    Returns
    -------
    xarray.Dataset
        One value per scalar coordinate, without ``chain`` and ``draw``.
    """
    return rank_diagnostics.map_quantities(dataset, rank_diagnostics.rank_rhat)


def ess(dataset: xr.Dataset, method: str = "bulk") -> xr.Dataset:
    """Effective sample size of every variable of a dataset.

    Parameters
    ----------
    dataset : xarray.Dataset
        Variables with ``chain`` and ``draw`` dimensions.
    method : {"bulk", "tail", "mean", "sd", ...}
        ArviZ's ESS method; ``"bulk"`` and ``"tail"`` (the quantiles :data:`TAIL_PROB`) are
        computed for every scalar at once (:mod:`.rank_diagnostics`), the others by ArviZ.

    Returns
    -------
    xarray.Dataset
    """
    if method in _RANK_ESS:  # ArviZ's numbers, for every scalar at once
        return rank_diagnostics.map_quantities(dataset, _RANK_ESS[method])
    return az.ess(dataset, method=method)


_RANK_ESS = {"bulk": rank_diagnostics.ess_bulk, "tail": rank_diagnostics.ess_tail}


def mcse(dataset: xr.Dataset, method: str = "mean") -> xr.Dataset:
    """Monte Carlo standard error of every variable of a dataset.

    Parameters
    ----------
    dataset : xarray.Dataset
    method : {"mean", "sd", ...}

    Returns
    -------
    xarray.Dataset
    """
    return az.mcse(dataset, method=method)


def summary(data: Any, **kwargs: Any) -> pd.DataFrame:
    """ArviZ's summary table (each line's own columns, see the module notes).

    Parameters
    ----------
    data : arviz.InferenceData, xarray.DataTree or xarray.Dataset
    **kwargs
        Passed to ``az.summary`` (``var_names``, ``kind``, ...).

    Returns
    -------
    pandas.DataFrame
        Rows ``name`` or ``name[i, ...]``; columns include ``mean``, ``sd``, ``ess_bulk``,
        ``ess_tail`` and ``r_hat`` under both lines.
    """
    return az.summary(data, **kwargs)


def bfmi(idata: Any) -> np.ndarray:
    """Bayesian fraction of missing information of each chain, from ``sample_stats.energy``.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree

    Returns
    -------
    numpy.ndarray
        Shape ``(chain,)``.
    """
    value = az.bfmi(idata)
    if ARVIZ_1:
        return np.asarray(value["energy"].values)
    return np.asarray(value)


@dataclass(frozen=True)
class Loo:
    """PSIS-LOO under one set of names.

    Attributes
    ----------
    elpd : float
        Expected log pointwise predictive density (0.x ``elpd_loo``).
    se : float
        Its standard error.
    p : float
        Effective number of parameters (0.x ``p_loo``).
    elpd_i : numpy.ndarray
        Pointwise values, one per observation (0.x ``loo_i``).
    pareto_k : numpy.ndarray
        Pareto shape of each observation's importance weights.
    warning : bool
        Whether ArviZ flagged unreliable Pareto k values.
    raw : object
        ArviZ's own result object.
    """

    elpd: float
    se: float
    p: float
    elpd_i: np.ndarray
    pareto_k: np.ndarray
    warning: bool
    raw: Any


def loo(idata: Any, var_name: str | None = None) -> Loo:
    """Pareto-smoothed importance-sampling leave-one-out cross-validation.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
        With a ``log_likelihood`` group (one value per observation and draw).
    var_name : str, optional
        The ``log_likelihood`` variable, needed when there are several.

    Returns
    -------
    Loo
    """
    result = az.loo(idata, pointwise=True, var_name=var_name)
    if ARVIZ_1:
        elpd, p, pointwise = result.elpd, result.p, result.elpd_i
    else:
        elpd, p, pointwise = result.elpd_loo, result.p_loo, result.loo_i
    return Loo(
        elpd=float(elpd),
        se=float(result.se),
        p=float(p),
        elpd_i=np.asarray(pointwise),
        pareto_k=np.asarray(result.pareto_k),
        warning=bool(result.warning),
        raw=result,
    )


#: 0.x's column names of ``az.compare`` and the names this module gives them (1.x's).
_COMPARE_COLUMNS_0X = {"elpd_loo": "elpd", "p_loo": "p"}


def compare(results: Mapping[str, Any]) -> pd.DataFrame:
    """ArviZ's LOO comparison of several results, with the columns named alike under both lines.

    Parameters
    ----------
    results : mapping of str to arviz.InferenceData or xarray.DataTree
        Each with a ``log_likelihood`` group over the same observations.

    Returns
    -------
    pandas.DataFrame
        One row per result, best first; columns ``rank``, ``elpd``, ``p``, ``elpd_diff``
        (each result's ``elpd`` minus the best one's: 0 for the first row, negative below, as in
        1.x; 0.x reports the opposite sign), ``weight``, ``se``, ``dse`` (and the others each
        line adds).
    """
    table = az.compare(dict(results))
    if ARVIZ_1:
        return table
    table = table.rename(columns=_COMPARE_COLUMNS_0X)
    # 0.x reports the best elpd minus each model's, 1.x each model's minus the best (+ 0.0: no -0)
    table["elpd_diff"] = -table["elpd_diff"] + 0.0
    return table


# ---------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------
def _components(idata: Any, var_names: Sequence[str] | None) -> int:
    """The number of scalar components of the posterior variables (all, or ``var_names``)."""
    posterior = get_group(idata, "posterior")
    names = list(posterior.data_vars) if var_names is None else list(var_names)
    sizes = [posterior[name].sizes for name in names]
    return sum(
        int(np.prod([size for dim, size in each.items() if dim not in SAMPLE_DIMS]))
        for each in sizes
    )


def _plottable(idata: Any, groups: Sequence[str]) -> Any:
    """A tree of ``groups`` (those present) where every dimension has an index coordinate:
    ``arviz_plots`` labels panels by coordinate value and fails on a dimension without one (the
    export gives every dimension one since 2026-12-02; files written before, and results built
    by hand with xarray, may lack them)."""
    chosen = {}
    for name in groups:
        if has_group(idata, name):
            dataset = get_group(idata, name)
            missing = {dim: np.arange(size) for dim, size in dataset.sizes.items()}
            chosen[name] = dataset.assign_coords(
                {dim: values for dim, values in missing.items() if dim not in dataset.coords}
            )
    return from_datasets(chosen)


def _figure_of(collection: Any) -> Any:
    """The Matplotlib figure of an ``arviz_plots`` plot, taken out of pyplot's care."""
    import matplotlib.pyplot as plt

    figure = collection.get_viz("figure")
    figure = getattr(figure, "item", lambda: figure)()
    plt.close(figure)  # still drawable and savable; pyplot no longer shows or holds it
    return figure


def _pyplot_off():
    import matplotlib.pyplot as plt

    return plt.ioff()


def _subplots_for(count: int) -> Any:
    """ArviZ's settings with room for ``count`` panels: ArviZ 1.x refuses more than its
    ``plot.max_subplots`` (40), which a small network's weights exceed, and 0.x draws 40 of them."""
    limit = max(int(az.rcParams["plot.max_subplots"] or 0), count)
    return az.rc_context({"plot.max_subplots": limit})


def plot_trace(
    idata: Any, var_names: Sequence[str] | None = None, figsize: tuple[float, float] | None = None
) -> Any:
    """Trace and marginal density of each scalar posterior component, one row each.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    var_names : sequence of str, optional
        Posterior variables to show (default: all).
    figsize : (float, float), optional
        Figure size in inches.

    Returns
    -------
    matplotlib.figure.Figure
        Not registered with pyplot: nothing is shown, nothing needs closing.
    """
    if ARVIZ_1:
        with _pyplot_off(), _subplots_for(2 * _components(idata, var_names)):
            collection = az.plot_trace_dist(
                _plottable(idata, ("posterior", "sample_stats")),
                var_names=var_names,
                compact=False,
                figure_kwargs={"figsize": figsize, "layout": "constrained"},
            )
            return _figure_of(collection)
    from matplotlib.figure import Figure

    count = _components(idata, var_names)
    figure = Figure(figsize=figsize, layout="constrained")
    # ArviZ 0.x draws into the axes it is given: pyplot never sees the figure
    with _subplots_for(2 * count):
        az.plot_trace(
            idata, var_names=var_names, compact=False, axes=figure.subplots(count, 2, squeeze=False)
        )
    return figure


def plot_rank(
    idata: Any,
    var_names: Sequence[str] | None = None,
    figsize: tuple[float, float] | None = None,
    columns: int = 2,
) -> Any:
    """Rank plot of each scalar posterior component (uniform ranks when the chains agree).

    ArviZ 0.x draws rank histograms, ArviZ 1.x the difference between the empirical CDF of the
    ranks and the uniform one, with a simultaneous envelope.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    var_names : sequence of str, optional
        Posterior variables to show (default: all).
    figsize : (float, float), optional
        Figure size in inches.
    columns : int
        Panels per row, at most.

    Returns
    -------
    matplotlib.figure.Figure
        Not registered with pyplot.
    """
    count = _components(idata, var_names)
    columns = max(1, min(count, columns))
    if ARVIZ_1:
        with _pyplot_off(), _subplots_for(count):
            collection = az.plot_rank(
                _plottable(idata, ("posterior",)),
                var_names=var_names,
                col_wrap=columns,
                figure_kwargs={"figsize": figsize, "layout": "constrained"},
            )
            return _figure_of(collection)
    from matplotlib.figure import Figure

    rows = -(-count // columns)
    figure = Figure(figsize=figsize, layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    with _subplots_for(count):
        az.plot_rank(idata, var_names=var_names, ax=axes.flat[:count])
    return figure


def plot_energy(idata: Any, figsize: tuple[float, float] | None = None) -> Any:
    """Marginal energy and energy-transition distributions (from ``sample_stats.energy``).

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    figsize : (float, float), optional

    Returns
    -------
    matplotlib.figure.Figure
        Not registered with pyplot.
    """
    if ARVIZ_1:
        with _pyplot_off():
            collection = az.plot_energy(
                _plottable(idata, ("sample_stats",)), figure_kwargs={"figsize": figsize}
            )
            return _figure_of(collection)
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize, layout="constrained")
    az.plot_energy(idata, ax=figure.add_subplot())
    return figure


def plot_forest(
    results: Mapping[str, Any],
    var_names: Sequence[str] | None = None,
    figsize: tuple[float, float] | None = None,
) -> Any:
    """Credible intervals of each scalar posterior component, one row per method (chains
    combined): HMC, SG-MCMC and SVI side by side.

    Parameters
    ----------
    results : mapping of str to arviz.InferenceData or xarray.DataTree
        Method name to its result; every result holds ``var_names``.
    var_names : sequence of str, optional
        Posterior variables to show (default: all of the first result's).
    figsize : (float, float), optional
        Figure size in inches.

    Returns
    -------
    matplotlib.figure.Figure
        Not registered with pyplot.
    """
    if not results:
        raise ValueError("results must name at least one result")
    if ARVIZ_1:
        with _pyplot_off():
            collection = az.plot_forest(
                {name: _plottable(idata, ("posterior",)) for name, idata in results.items()},
                var_names=var_names,
                combined=True,
                figure_kwargs={"figsize": figsize, "layout": "constrained"},
            )
            if len(results) > 1:
                collection.add_legend("model")
            return _figure_of(collection)
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize, layout="constrained")
    az.plot_forest(
        list(results.values()),
        model_names=list(results),
        var_names=var_names,
        combined=True,
        ax=figure.add_subplot(),
    )
    return figure


def plot_pair(
    idata: Any, var_names: Sequence[str] | None = None, figsize: tuple[float, float] | None = None
) -> Any:
    """Scatter plots of every pair of scalar posterior components (all chains), with the
    marginal distributions on the diagonal.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
    var_names : sequence of str, optional
        Posterior variables to show (default: all); two scalar components at least.
    figsize : (float, float), optional
        Figure size in inches.

    Returns
    -------
    matplotlib.figure.Figure
        Not registered with pyplot.
    """
    count = _components(idata, var_names)
    if count < 2:
        raise ValueError(f"a pair plot needs two scalar components at least, got {count}")
    if ARVIZ_1:
        with _pyplot_off():
            collection = az.plot_pair(
                _plottable(idata, ("posterior",)),
                var_names=var_names,
                figure_kwargs={"figsize": figsize, "layout": "constrained"},
            )
            return _figure_of(collection)
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize, layout="constrained")
    az.plot_pair(
        idata, var_names=var_names, marginals=True, ax=figure.subplots(count, count, squeeze=False)
    )
    return figure
