"""Time of a convergence verdict's statistics: ``rank_diagnostics`` against ArviZ, same draws.

A verdict needs the rank-normalised split R-hat and the bulk and tail ESS of every quantity it
judges; for a network those are its outputs at the test inputs, thousands for a classifier (a
few hundred rows times its classes). The baseline is the installed ArviZ (``az.rhat`` and
``az.ess``, one quantity at a time); the candidate is
:func:`pyro_sgmcmc.analysis.rank_diagnostics.worst_of_all` (every quantity at once). Draws: 2
chains of random walks plus noise, for each number of quantities and draws; each row also checks
that both give the same worst statistics.

Run: ``python benchmarks/verdict_speed.py [--quantities 30 3590] [--draws 700 1700]``; prints a
table and writes ``benchmarks/results/verdict_speed.json``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import arviz as az
import numpy as np
import xarray as xr
from _common import load_average, print_table, write_json

from pyro_sgmcmc.analysis import _arviz
from pyro_sgmcmc.analysis.rank_diagnostics import worst_of_all


def arviz_worst(draws: np.ndarray) -> tuple[float, float, float]:
    """The worst R-hat and smallest bulk and tail ESS, by ArviZ one quantity at a time."""
    dataset = xr.Dataset({"v": (("chain", "draw", "k"), draws)})
    tail = {"prob": _arviz.TAIL_PROB} if _arviz.ARVIZ_1 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rhat = az.rhat(dataset)["v"].values
        bulk = az.ess(dataset, method="bulk")["v"].values
        tail_ess = az.ess(dataset, method="tail", **tail)["v"].values
    return float(rhat.max()), float(bulk.min()), float(tail_ess.min())


def timed(function, draws: np.ndarray) -> tuple[float, tuple[float, float, float]]:
    start = time.perf_counter()
    result = function(draws)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantities", type=int, nargs="+", default=[30, 3590])
    parser.add_argument("--draws", type=int, nargs="+", default=[700])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for count in args.quantities:
        for length in args.draws:
            draws = rng.normal(size=(2, length, count)).cumsum(1) * 0.1
            draws += rng.normal(size=draws.shape)
            arviz_seconds, expected = timed(arviz_worst, draws)
            ours_seconds, found = timed(worst_of_all, draws)
            rows.append({
                "quantities": count, "draws per chain": length,
                "ArviZ [s]": round(arviz_seconds, 3),
                "rank_diagnostics [s]": round(ours_seconds, 3),
                "speed-up": round(arviz_seconds / ours_seconds, 1),
                "same numbers": bool(np.allclose(found, expected, rtol=1e-9)),
            })  # fmt: skip
    columns = list(rows[0])
    print(f"ArviZ {az.__version__}, load average {load_average()}")
    print_table(rows, columns)
    path = write_json("verdict_speed", {"arviz": az.__version__, "load": load_average(),
                                        "rows": rows})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
