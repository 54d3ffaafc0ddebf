r"""Every result as an ArviZ result object: MCMC (NUTS, HMC, SG-MCMC) and SVI.

Under ArviZ 0.x the result is an ``arviz.InferenceData``, under ArviZ 1.x an ``xarray.DataTree``;
both hold the groups below, with the same variables, dimensions, dtypes and attributes.

:func:`to_inference_data` builds the groups directly from xarray datasets, without
``arviz.from_pyro`` (which, in ArviZ 0.23, needs a ``divergences`` diagnostic, silently drops the
log-likelihood of ``PyroModule`` networks whose vectorised trace fails, and which ArviZ 1.x no
longer has).

Groups
------
=============================  ==============================================================
group                          content
=============================  ==============================================================
``posterior``                  constrained draws of every latent site, dims
                               ``(chain, draw, <site>_dim_0, ...)``, an axis that a plate
                               spans named after the plate
``sample_stats``               per-draw statistics, see the table below
``log_likelihood``             :math:`\log p(y_i \mid \theta^{(c,s)})` per observation ``i`` of
                               the full training set, one variable per observed site
``posterior_predictive``       :math:`\tilde y \sim p(y \mid \theta^{(c,s)})` on the training
                               inputs, and every ``pyro.deterministic`` site (e.g. the
                               network output) per draw
``observed_data``              the observed sites of the model on the training data
``constant_data``              the tensor arguments of the model that are not observed values
``predictions``                :math:`\tilde y \sim p(y \mid x_\ast, \theta^{(c,s)})` on ``test``
``predictions_constant_data``  every tensor argument of the test call (inputs and targets)
``svi_loss``                   SVI only: the loss (negative ELBO estimate) per step, dims
                               ``(chain, svi_step)``; one chain per independent fit
=============================  ==============================================================

``sample_stats`` uses ArviZ's names where one exists:

* NUTS / HMC (with :class:`HMCStatsCollector` as ``hook_fn``): ``step_size``,
  ``acceptance_rate`` (the Metropolis acceptance probability of the transition; for NUTS the
  average over the tree), ``lp`` (minus Pyro's potential energy: the log joint in unconstrained
  space, log-Jacobian included), ``energy`` (the Hamiltonian of the transition, see
  :class:`HMCStatsCollector`; what ``az.plot_energy`` and ``az.bfmi`` read) and ``diverging``.
  NUTS' tree depth is not available. Without the collector only ``diverging`` (from
  ``MCMC.diagnostics()``) is exported, and the mean acceptance rate per chain goes to the
  attributes.
* SG-MCMC kernels: ``step_size``, ``temperature``, ``lp`` (minus the *minibatch* potential
  energy at the last gradient step of the draw: a noisy, unbiased estimate) and ``diverging``.
* SVI: ``lp``, the full-data log joint :math:`\log p(\theta) + \sum_i \log p(y_i\mid\theta)` in
  constrained space (no Jacobian), computed in the same pass as the log-likelihood; with a
  learnable prior (``fit_svi(prior=...)``) each fit's fitted prior.
* a chains source (:func:`~pyro_sgmcmc.run_chains`): the statistics it recorded.
* any other ``MCMCKernel``: ``diverging`` if it reports ``divergences``, and every diagnostic that
  is an array with one entry per draw.

Log-likelihood and predictive draws
-----------------------------------
For each draw the model is traced with its latent sites conditioned on the draw and the
observations un-conditioned (``poutine.condition(poutine.uncondition(model), draw)``): the
observed site then carries both the distribution, whose ``log_prob`` of the observation is the
log-likelihood, and a fresh predictive sample. Rows are processed in chunks of ``chunk_size`` by
conditioning the data plate's index site on each chunk, as the kernels do with minibatches (the
``N/B`` scale Pyro then applies is ignored: the unscaled ``fn.log_prob`` is used). Batch dimensions
of an observation other than the plate's are summed, so there is one value per row of the plate,
which is what ``az.loo`` needs. The values are stored in ``float64`` whatever the model's dtype:
ArviZ runs its Pareto smoothing in the dtype of the array, and a ``float32`` SGHMC export was
reported to give NaN in ``az.loo`` / ``az.compare`` where the same values in ``float64`` did not.
A model that does not index its data with the plate's indices (``pyro.plate("data",
len(x))`` with ``obs=y``) is chunked by slicing its row-aligned tensor arguments instead (every
tensor argument whose first dimension has ``N`` rows). A model with a method
``pointwise_log_likelihood(params, subsample, *args, **kwargs)`` (returning a tensor of shape
``(B,)``, or a mapping from observed-site name to such tensors) is used instead of the trace for
the log-likelihood (the *fast path*). Nothing is ever dropped silently: a failure raises.

Checks
------
The draws must be draws of the model's latent sites: a site the model samples but the draws lack
(it would be redrawn from its prior for every draw), a draw of a site the model does not have,
or a shape that differs raises :class:`ModelMismatchError`. The posterior attributes keep a
fingerprint of the model (``model``: for a :class:`~pyro_sgmcmc.nn.BayesianMLP` its
architecture, activation, prior, likelihood and temperature; for another ``torch.nn.Module`` its
class and ``repr``; for a function its qualified name and a hash of its code). When the model
passed differs from the model of the run (another object) with another fingerprint, the export
raises :class:`ModelMismatchError` for two ``BayesianMLP`` (whose fingerprint determines the
density), and warns otherwise (a different function or module can compute the same density,
e.g. a subclass that adds a fast path); ``check_model=False`` turns this check off. Observed values
outside the support of their distribution (a class label outside ``[0, K)``), NaN or infinite
values, and a test set whose columns differ from the training data's are refused with a
``ValueError`` that names ``test`` (or the training arguments). Training arguments given for an
SVI fit, a Pyro ``MCMC`` run or a :func:`~pyro_sgmcmc.run_chains` result must be the data it was
fitted on, which each keeps (the same values; NumPy, another device or dtype, by keyword or by
position, or a default spelled out, is fine: :mod:`~pyro_sgmcmc.analysis.fitted_data`):
``observed_data`` and ``log_likelihood`` describe the data the posterior was fitted to, so other
data are refused with a ``ValueError`` naming the argument and pointing held-out data to
``test``.

ArviZ 0.x and 1.x
-----------------
Every group is built as an ``xarray.Dataset`` first (:func:`build_groups` returns them);
:func:`to_inference_data` puts them into the result object of the installed ArviZ through
:mod:`pyro_sgmcmc.analysis._arviz` (0.x: ``az.InferenceData(**groups)``; 1.x:
``xarray.DataTree.from_dict``), and :func:`to_datatree` always builds a ``DataTree``. Read a result
the same way under both lines with ``pyro_sgmcmc.analysis._arviz`` (``group_names``, ``get_group``,
``to_netcdf``, ``load_netcdf``, ``loo``, ...), or with each line's own API: 0.x ``idata.groups()``,
``az.from_netcdf``; 1.x ``list(tree.children)``, ``xarray.open_datatree``, and ``arviz_stats`` /
``arviz_plots`` (``az.summary``, ``az.loo``, ``az.plot_trace_dist``, ``az.plot_rank``). The
custom group ``svi_loss`` is kept by both. Nothing in the kernels depends on the line.

This module is the public entry; the work is done in one module per job, whose public names
it re-exports: :mod:`~pyro_sgmcmc.analysis.export_groups` (:func:`build_groups`: the groups from a
source), :mod:`~pyro_sgmcmc.analysis.export_sources` (draws, statistics and attributes of an MCMC
run, an SVI fit or a chains source), :mod:`~pyro_sgmcmc.analysis.export_hmc_stats`
(:class:`HMCStatsCollector`), :mod:`~pyro_sgmcmc.analysis.export_checks` (the checks above and
:func:`model_fingerprint`), :mod:`~pyro_sgmcmc.analysis.export_trace` (the log-likelihood and
predictive passes) and :mod:`~pyro_sgmcmc.analysis.export_xarray` (arrays to labelled datasets).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import xarray as xr

from ..errors import ModelMismatchError, ModelMismatchWarning
from . import _arviz
from .export_checks import model_fingerprint
from .export_groups import build_groups
from .export_hmc_stats import HMCStatsCollector
from .export_hmc_stats import _MomentumProbe as _MomentumProbe  # pickles made before the split
from .export_sources import CHAINS_SOURCE_ATTRIBUTES as CHAINS_SOURCE_ATTRIBUTES
from .export_sources import TensorDict as TensorDict
from .export_trace import OUTPUT as OUTPUT
from .export_xarray import _numpy_dict
from .fitted_data import describe_value

__all__ = [
    "HMCStatsCollector",
    "ModelMismatchError",
    "ModelMismatchWarning",
    "build_groups",
    "from_draws",
    "model_fingerprint",
    "to_datatree",
    "to_inference_data",
]


def to_inference_data(
    source: Any,
    model: Callable[..., Any] | None = None,
    /,
    *args: Any,
    model_kwargs: Mapping[str, Any] | None = None,
    test: tuple | None = None,
    test_kwargs: Mapping[str, Any] | None = None,
    num_draws: int = 500,
    hmc_stats: HMCStatsCollector | None = None,
    wall_time: float | None = None,
    log_likelihood: bool = True,
    posterior_predictive: bool = True,
    plate_name: str | None = None,
    chunk_size: int | None = None,
    use_fast_path: bool = True,
    seed: int | None = 0,
    dims: Mapping[str, Sequence[str]] | None = None,
    check_model: bool = True,
    **unexpected: Any,
) -> Any:
    r"""Convert an MCMC run or an SVI fit into an ``arviz.InferenceData`` (ArviZ 0.x) or an
    ``xarray.DataTree`` (ArviZ 1.x).

    Parameters
    ----------
    source:
        A ``pyro.infer.MCMC`` after ``run`` (NUTS, HMC, :class:`~pyro_sgmcmc.SGLD`,
        :class:`~pyro_sgmcmc.SGHMC`, :class:`~pyro_sgmcmc.PSGLD` or any ``MCMCKernel``; one or
        several chains), or a :class:`~pyro_sgmcmc.variational.svi.SVIResult` (each independent fit
        becomes a chain of ``num_draws`` independent draws from its guide).
    model:
        The model; defaults to ``mcmc.kernel.model`` or ``result.model``.
    *args, model_kwargs:
        The model's training arguments (full data); default to those of the run. NumPy arrays
        and lists of numbers are converted to tensors
        (:func:`~pyro_sgmcmc._validation.as_tensor_arguments`). They must be the data the
        result was fitted on (it keeps them, so they can be left out); other data are refused
        with a ``ValueError`` naming the argument: held-out data go in ``test``.
    test, test_kwargs:
        Positional (and keyword) model arguments of a test set, e.g. ``(x_test, y_test)`` or
        ``(x_test,)``: fills ``predictions`` and ``predictions_constant_data``. Each tensor must
        have the training tensor's dimensions but the rows, finite values, and observed values
        in the support of their distribution. A ``run_chains`` result given a test set
        defaults to it (the run judged a network there).
    num_draws:
        Draws per SVI fit, an integer >= 1 (ignored for MCMC).
    hmc_stats:
        The :class:`HMCStatsCollector` passed as ``hook_fn`` to ``MCMC`` for NUTS/HMC (any other
        object is a ``TypeError``).
    wall_time:
        Seconds the inference took; stored as the ``sampling_time`` attribute (used for ESS per
        second by :func:`pyro_sgmcmc.analysis.diagnostics.convergence_report`). SVI fits,
        ``run_chains`` results and ``MCMC`` runs of this package's kernels record their own
        (an ``MCMC`` run: its chains' warm-up and draws, summed over chains run one after the
        other, the longest of chains run in parallel; their set-up in ``setup_time``).
    log_likelihood, posterior_predictive:
        Whether to compute those groups (one model trace per draw and row chunk).
    plate_name:
        Name of the data plate; also the name of the observation dimension. ``None`` (default):
        the plate the run subsampled (the ``subsample_plate`` of this package's kernels, in
        ``MCMC`` or :func:`~pyro_sgmcmc.run_chains`; ``fit_svi``'s ``plate_name``), and
        ``"data"`` for other sources (NUTS, HMC).
    chunk_size:
        Rows of the data plate per trace (``None``: all at once); bounds memory for large data.
        Works for models that index their data with the plate's indices and for models that size
        the plate from the data (``obs=y``; their row-aligned tensor arguments are sliced).
    use_fast_path:
        Use the model's ``pointwise_log_likelihood`` method for ``log_likelihood`` if it has one.
    seed:
        Seed of the predictive draws (and of the SVI guide draws); ``None`` uses torch's global
        generator. The global generator's state is left untouched otherwise.
    dims:
        Dimension names (without ``chain``/``draw``) per variable, overriding the defaults:
        ``plate_name`` for the rows, another plate's name for the axes it spans (not where it
        subsamples), ``<name>_dim_<k>`` for the rest. For a site, in every group
        that holds it (an observed site's ``log_likelihood`` takes the leading names, its event
        dimensions being summed there), and for a model argument by its parameter name (e.g.
        ``{"obs": ["row"], "x": ["row", "feature"]}``), in ``constant_data`` and
        ``predictions_constant_data``. Every dimension gets integer coordinates, as ArviZ's
        own converters give them.
    check_model:
        Compare the fingerprint of ``model`` with the run's model when they are different
        objects (module docstring, "Checks"); ``False`` skips this comparison (never the check
        of the latent sites).
    **unexpected:
        Refused, with the advice to pass the model's keyword data as ``model_kwargs`` (as
        ``mcmc.run(x=x, y=y)`` takes them): they could clash with the options above.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        With the groups listed in the module docstring (a ``DataTree`` under ArviZ 1.x, whose
        children are these groups).

    Raises
    ------
    ModelMismatchError
        When ``model`` does not have the draws' latent sites and shapes, or is another
        ``BayesianMLP`` than the run's.
    ValueError
        On invalid arguments, a model without observed sites, data with NaN or infinite values,
        observed values outside their distribution's support (e.g. labels outside the classes), a
        test set whose columns differ from the training data's, or a model that fails on it.
    TypeError
        For an unknown source, a ``model`` that is not callable (data given where the model
        goes), an ``hmc_stats`` that is not an :class:`HMCStatsCollector`, or another keyword.

    References
    ----------
    R. Kumar, C. Carroll, A. Hartikainen and O. Martin, "ArviZ a unified library for exploratory
    analysis of Bayesian models in Python", JOSS 4(33), 2019.

    A. Vehtari, A. Gelman and J. Gabry, "Practical Bayesian model evaluation using leave-one-out
    cross-validation and WAIC", Statistics and Computing 27, 2017 (why ``log_likelihood`` is per
    observation).
    """
    positional = [name for name in ("source", "model") if name in unexpected]
    if positional:
        raise TypeError(
            f"to_inference_data() takes {' and '.join(positional)} by position: "
            "to_inference_data(result, model, x, y), or to_inference_data(result)"
        )
    if "coords" in unexpected:
        raise TypeError(
            "to_inference_data() takes no coords= (az.from_pyro's): dims= names a site's "
            "dimensions, e.g. dims={'w': ['feature']}, with integer coordinates; give them "
            "labels afterwards with xarray's assign_coords(feature=[...]) on the groups "
            "(idata.assign_coords(...) with ArviZ 0.x)"
        )
    if unexpected:
        names = ", ".join(repr(name) for name in unexpected)
        given = ", ".join(f"{name}=..." for name in unexpected)
        raise TypeError(
            f"to_inference_data() got unexpected keyword argument(s) {names}: the model's "
            f"keyword data go in model_kwargs=dict({given}) (positional data after the model, "
            "to_inference_data(result, model, x, y)); the options are model_kwargs, test, "
            "test_kwargs, num_draws, hmc_stats, wall_time, log_likelihood, "
            "posterior_predictive, plate_name, chunk_size, use_fast_path, seed, dims and "
            "check_model"
        )
    if model is not None and not callable(model):
        raise TypeError(
            f"model (the second argument) must be the Pyro model, got {describe_value(model)}: "
            "data go after it, to_inference_data(result, model, x, y), or leave both out, "
            "to_inference_data(result), to export the data the result was fitted on"
        )
    groups = build_groups(
        source,
        model,
        *args,
        model_kwargs=model_kwargs,
        test=test,
        test_kwargs=test_kwargs,
        num_draws=num_draws,
        hmc_stats=hmc_stats,
        wall_time=wall_time,
        log_likelihood=log_likelihood,
        posterior_predictive=posterior_predictive,
        plate_name=plate_name,
        chunk_size=chunk_size,
        use_fast_path=use_fast_path,
        seed=seed,
        dims=dims,
        check_model=check_model,
    )
    return _arviz.from_datasets(groups)


def to_datatree(
    source: Any, model: Callable[..., Any] | None = None, /, *args: Any, **options: Any
) -> xr.DataTree:
    """The groups of :func:`to_inference_data` as an ``xarray.DataTree`` (ArviZ 1.x layout).

    Takes the same arguments as :func:`to_inference_data`.

    Returns
    -------
    xarray.DataTree
        One child per group, under ArviZ 0.x as under 1.x.
    """
    groups = build_groups(source, model, *args, **options)
    return xr.DataTree.from_dict({f"/{name}": dataset for name, dataset in groups.items()})


def from_draws(posterior: Mapping[str, Any], **groups: Mapping[str, Any]) -> Any:
    """The installed ArviZ's result object built from arrays of draws, e.g. of quantities
    derived from a run's samples.

    ArviZ 0.x spells this ``az.from_dict(posterior=...)`` and ArviZ 1.x
    ``az.from_dict({"posterior": ...})``; this call works under both.

    Parameters
    ----------
    posterior:
        Variable name to draws shaped ``(chain, draw, ...)`` (tensors or arrays); the other
        dimensions are named ``<name>_dim_<k>``.
    **groups:
        Other groups the same way, e.g. ``posterior_predictive={"obs": ...}``;
        ``observed_data`` and ``constant_data`` without ``chain`` and ``draw``.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        ``InferenceData`` under ArviZ 0.x, ``DataTree`` under 1.x, for ``az.summary``,
        ``az.ess``, :func:`~pyro_sgmcmc.analysis.diagnostics.convergence_report` and the rest.

    Examples
    --------
    >>> import numpy as np
    >>> from pyro_sgmcmc.analysis.export import from_draws
    >>> idata = from_draws({"sigma": np.ones((2, 100))})
    >>> idata.posterior["sigma"].dims
    ('chain', 'draw')
    """
    as_arrays = {name: _numpy_dict(values) for name, values in groups.items()}
    draws = {"posterior": _numpy_dict(posterior), **as_arrays}
    for group, variables in draws.items():
        if group in ("observed_data", "constant_data", "predictions_constant_data"):
            continue  # data: no chain and draw
        for name, values in variables.items():
            if values.ndim < 2:
                raise ValueError(
                    f"{group} variable {name!r} must be shaped (chain, draw, ...), got shape "
                    f"{tuple(values.shape)}: one chain of draws is values[None]"
                )
    return _arviz.from_samples(**draws)
