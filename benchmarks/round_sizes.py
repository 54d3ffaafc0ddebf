"""What short rounds are worth to a run until converged: the demo's SG-MCMC rows with the rounds
as the package sizes them, and with one round as long as the verdict asks.

``run_chains(..., target_ess=...)`` judges its draws and, while the run has not converged,
draws on in rounds (:mod:`pyro_sgmcmc.inference.rounds`). A round used to be as long as the
verdict's "run about k times longer" asked; now it adds at most
:data:`~pyro_sgmcmc.inference.rounds.ROUND_GROWTH` of the draws so far. The baseline lifts that
bound (``ROUND_GROWTH`` set to 1e9) in the same process; everything else is the package's own.

Each method runs as ``pyro-sgmcmc compare --methods METHOD --jobs 1`` runs it (the demo's
sinusoid network, 2 chains, ``--target-ess 200``, ``--max-seconds 60``), once with each
sizing, alternating. The table gives, per method and sizing, the wall time of the inference, the
draws per chain, the verdicts' draw counts, the verdict and the ESS of f(x) at the test inputs,
and the ratio of the wall times. The draws of a run are a prefix of the other's, bit for bit,
so a difference is the rounds alone.

Run: ``python benchmarks/round_sizes.py [--methods sghmc psgld]``; writes
``benchmarks/results/round_sizes.json``.
"""

from __future__ import annotations

import argparse
import warnings

from _common import load_average, print_table, write_json

import pyro_sgmcmc.inference.rounds as rounds
from pyro_sgmcmc.cli.compare_config import CompareConfig, load_data
from pyro_sgmcmc.cli.compare_method import run_method

#: The baseline's bound on a round: none (a round is as long as the verdict asks).
UNBOUNDED = 1e9


def run(method: str, growth: float) -> dict:
    """One method of the demo with the rounds bounded by ``growth``: its row."""
    config = CompareConfig(methods=(method,), progress=False, figures=False)
    judged: list[int] = []
    judge = rounds._Rounds.judge

    def recorded(self):
        judged.append(self.recorder.count)
        return judge(self)

    saved = rounds.ROUND_GROWTH
    rounds.ROUND_GROWTH, rounds._Rounds.judge = growth, recorded
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = run_method(config, load_data(config), method)
    finally:
        rounds.ROUND_GROWTH, rounds._Rounds.judge = saved, judge
    row = outcome.result
    return {
        "method": method,
        "rounds": "bounded" if growth == saved else "as the verdict asks",
        "wall_s": round(row.wall_time, 1),
        "draws": judged[-1] if judged else None,
        "judged_at": judged,
        "verdict": str(row.diagnostics.get("verdict", row.status)).split(";")[0],
        "ess_fx": round(row.diagnostics.get("min_ess_bulk_output") or float("nan"), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["sghmc", "psgld"])
    args = parser.parse_args()
    rows = []
    for method in args.methods:
        bounded = run(method, rounds.ROUND_GROWTH)
        unbounded = run(method, UNBOUNDED)
        bounded["vs_unbounded"] = round(bounded["wall_s"] / unbounded["wall_s"], 2)
        rows += [unbounded, bounded]
    columns = ["method", "rounds", "wall_s", "draws", "judged_at", "verdict", "ess_fx",
               "vs_unbounded"]  # fmt: skip
    print_table(rows, columns)
    path = write_json("round_sizes", {"load_average": load_average(), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
