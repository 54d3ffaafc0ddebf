r"""A run's verdict from its draws: parameters for identified models, outputs for networks.

:func:`run_verdict` judges the draws of a run (:func:`~pyro_sgmcmc.run_chains`, or the chains a
``pyro.infer.MCMC`` kernel has run) with :func:`~pyro_sgmcmc.analysis.diagnostics.judge`: on every
parameter for a model whose parameters are identified, and for a network
(:func:`~pyro_sgmcmc.models.hidden_units.has_hidden_units`) on its outputs :math:`f(x)` -- the
model's return value, or its site ``output`` -- at up to :data:`OUTPUT_ROWS` training rows spread
over the data (:class:`OutputDraws`), or at every row of a test set (:class:`HeldOutOutputDraws`:
the outputs ``to_inference_data(..., test=...)`` stores, which
:func:`~pyro_sgmcmc.analysis.diagnostics.convergence_report` judges). Both evaluate each draw
once however often the run is judged. A classifier's outputs are judged as its class
probabilities (:mod:`.judged_outputs`), as ``convergence_report`` judges its export.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import xarray as xr
from pyro import poutine

from ..models.hidden_units import has_hidden_units
from ..models.structure import DataPlate, spread_rows
from .diagnostics import Verdict, judge, worst_statistics
from .export_trace import OUTPUT, _test_pass, returned_output
from .export_xarray import _reshape_draws
from .judged_outputs import apply_link, output_link, traced_output_link

__all__ = [
    "OUTPUT_ROWS",
    "HeldOutOutputDraws",
    "OutputDraws",
    "judged_training_rows",
    "run_verdict",
    "where_judged",
]

#: Training rows at which a network's outputs are judged.
OUTPUT_ROWS = 64

TensorDict = dict[str, torch.Tensor]


class OutputDraws:
    """A network's outputs at fixed training rows for each draw, ``(C, S, ...)``, evaluated
    once per draw.

    Parameters
    ----------
    model, args, kwargs:
        The model and its full-data arguments.
    plate:
        The model's data plate (restricts the model to the rows).
    """

    def __init__(
        self, model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], plate: DataPlate
    ) -> None:
        rows = min(OUTPUT_ROWS, plate.max_rows)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        self.rows = spread_rows(rows, plate.num_data, device)
        self.num_data = plate.num_data
        self.bound = plate.bind(model, args, kwargs, self.rows)
        self.values: list[np.ndarray] = []  # per draw index, (C, ...)
        #: The link from the outputs to a classifier's class probabilities
        #: (:func:`~.judged_outputs.output_link` of the first draw's trace).
        self.link: str | None = None
        self._link_read = False
        #: Seconds spent evaluating outputs (each draw's once).
        self.seconds = 0.0

    def __call__(self, samples: Mapping[str, torch.Tensor]) -> np.ndarray | None:
        """``(C, S, ...)`` outputs for constrained ``samples`` ``(C, S, ...)`` per site
        (``None`` if the model returns no output per row)."""
        began = time.perf_counter()
        try:
            return self._stacked(samples)
        finally:
            self.seconds += time.perf_counter() - began

    def _stacked(self, samples: Mapping[str, torch.Tensor]) -> np.ndarray | None:
        num_chains, num_draws = next(iter(samples.values())).shape[:2]
        for s in range(len(self.values), num_draws):
            outputs = []
            for c in range(num_chains):
                output = self._output({name: value[c, s] for name, value in samples.items()})
                if output is None:
                    return None
                outputs.append(output)
            self.values.append(np.stack(outputs))
        if not self.values:
            return None
        return np.stack(self.values[:num_draws], axis=1)

    def _output(self, latents: TensorDict) -> np.ndarray | None:
        model, args, kwargs = self.bound
        with torch.no_grad():
            trace = poutine.trace(poutine.condition(model, data=dict(latents))).get_trace(
                *args, **kwargs
            )
        site = trace.nodes.get(OUTPUT)
        value = site["value"] if site is not None else returned_output(trace, latents)
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return None
        if not self._link_read:
            self.link, self._link_read = output_link(trace, latents), True
        if value.shape[0] == self.num_data and self.num_data != len(self.rows):
            value = value.index_select(0, self.rows.to(value.device))
        if value.shape[0] != len(self.rows):
            return None
        return value.detach().double().cpu().numpy()


def where_judged(outputs: OutputDraws | HeldOutOutputDraws | None, verdict: Verdict) -> str:
    """What an end-of-run warning adds about where a network's outputs were judged: at
    training rows the verdict can differ from :func:`~pyro_sgmcmc.convergence_report`'s on an
    export with test inputs, which judges those (``""`` for parameters or test inputs)."""
    if verdict.basis != "f(x)" or not isinstance(outputs, OutputDraws):
        return ""
    return (
        f" (judged on the outputs at {len(outputs.rows)} training rows; an export with "
        "test=... is judged on the test inputs by convergence_report)"
    )


def judged_training_rows(
    outputs: OutputDraws | HeldOutOutputDraws | None, verdict: Verdict | None
) -> tuple[tuple[int, ...], int]:
    """The training rows at which a network's verdict judged its outputs, and the number of
    rows of the data (``((), 0)`` for parameters or test inputs): recorded with the export, so
    that :func:`~pyro_sgmcmc.convergence_report` of an export without test inputs judges the
    same rows and says what the run said."""
    if verdict is None or verdict.basis != "f(x)" or not isinstance(outputs, OutputDraws):
        return (), 0
    return tuple(int(r) for r in outputs.rows.tolist()), int(outputs.num_data)


class HeldOutOutputDraws:
    """A network's outputs at every row of a test set for each draw, ``(C, S, rows, ...)``:
    the values ``to_inference_data(..., test=...)`` stores as ``predictions["output"]``, from
    the same pass over the draws, evaluated once per draw.

    Parameters
    ----------
    model, args:
        The model and its positional training arguments (the test set is checked against them).
    plate_name:
        The model's data plate.
    test, test_kwargs:
        Positional and keyword model arguments of the test set, as tensors.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        args: tuple,
        plate_name: str,
        test: tuple,
        test_kwargs: Mapping[str, Any],
    ) -> None:
        self.model, self.args, self.plate_name = model, args, plate_name
        self.test, self.test_kwargs = test, dict(test_kwargs)
        self.values: list[np.ndarray] = []  # per draw index, (C, rows, ...)
        self.has_output = True
        #: The link from the outputs to a classifier's class probabilities (read from the
        #: trace of the first draw on the test set; ``None`` before the first).
        self.link: str | None = None
        self._link_read = False
        #: Seconds spent evaluating outputs (each draw's once).
        self.seconds = 0.0

    def check(self, draw: Mapping[str, torch.Tensor]) -> None:
        """Evaluate the test set at constrained ``draw`` ``(C, ...)`` per site (e.g. the chains'
        starting points) and keep nothing: a test set the model fails on (dtype, device, values
        outside the likelihood's support) raises the export's ``ValueError`` naming ``test``
        before a run rather than after it."""
        self._outputs({name: value.unsqueeze(1) for name, value in draw.items()}, read_link=False)

    def __call__(self, samples: Mapping[str, torch.Tensor]) -> np.ndarray | None:
        """``(C, S, rows, ...)`` outputs for constrained ``samples`` ``(C, S, ...)`` per site
        (``None`` if the model returns no output per row)."""
        num_draws = next(iter(samples.values())).shape[1]
        done = len(self.values)
        if self.has_output and done < num_draws:
            new = {name: value[:, done:num_draws] for name, value in samples.items()}
            began = time.perf_counter()
            outputs = self._outputs(new)
            self.seconds += time.perf_counter() - began
            self.has_output = outputs is not None
            if outputs is not None:
                self.values.extend(outputs[:, s] for s in range(num_draws - done))
        if not self.has_output or not self.values:
            return None
        return np.stack(self.values[:num_draws], axis=1)

    def _outputs(
        self, samples: Mapping[str, torch.Tensor], read_link: bool = True
    ) -> np.ndarray | None:
        """The export's test pass over ``samples`` ``(C, S, ...)``: ``(C, S, rows, ...)``; with
        ``read_link``, the link read from the first of them (a draw, not a starting point)."""
        num_chains, num_draws = next(iter(samples.values())).shape[:2]
        devices = {t.device for t in self.test if isinstance(t, torch.Tensor)}
        cuda = [device for device in devices if device.type == "cuda"]
        with torch.random.fork_rng(devices=cuda):  # observed sites are drawn: keep the RNG
            traced = _test_pass(self.model, samples, self.test, self.test_kwargs, self.args,
                                plate_name=self.plate_name, chunk_size=None,
                                read_output=True)  # fmt: skip
            if read_link and not self._link_read:  # the test set checked by the pass
                first = {name: value[0, 0] for name, value in samples.items()}
                self.link = traced_output_link(self.model, first, self.test, self.test_kwargs)
                self._link_read = True
        outputs = traced.predictive.get(OUTPUT)
        if outputs is None:
            return None
        return _reshape_draws(outputs, num_chains, num_draws)


def run_verdict(
    samples: Mapping[str, torch.Tensor],
    model: Callable[..., Any],
    outputs: OutputDraws | HeldOutOutputDraws | None,
    *,
    min_ess: float | None = None,
) -> Verdict:
    """The verdict on constrained ``samples`` ``(C, S, ...)`` per site: on ``outputs`` for a
    network (when it returns them), else on every parameter."""
    num_chains = int(next(iter(samples.values())).shape[0])
    network = has_hidden_units(model, {n: v.shape[2:] for n, v in samples.items()})
    values = outputs(samples) if network and outputs is not None else None
    if values is not None:
        values = apply_link(values, outputs.link)
        dataset = xr.Dataset({"output": (("chain", "draw", *_dims("output", values)), values)})
    else:
        network = False
        dataset = xr.Dataset(
            {
                name: (("chain", "draw", *_dims(name, array)), array)
                for name, value in samples.items()
                for array in [value.detach().double().cpu().numpy()]
            }
        )
    max_rhat, min_bulk, min_tail, spread = worst_statistics(dataset)
    return judge(
        max_rhat, min_bulk, min_tail, num_chains, function_space=network, min_ess=min_ess,
        num_draws=int(dataset.sizes["draw"]), spread=spread,
    )  # fmt: skip


def _dims(name: str, array: np.ndarray) -> list[str]:
    return [f"{name}_dim_{k}" for k in range(array.ndim - 2)]
