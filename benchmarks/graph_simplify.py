"""What simplifying the recorded gradient graphs is worth: ``run_chains`` with and without it.

The three models of ``ess_per_second.py`` that are not networks -- (i) Pyro's tutorial
regression (batch 50), (ii) logistic regression on 100,000 rows (batch 500), (iii) varying
intercepts (batch 100) -- sampled by SGHMC with ``run_chains`` (4 chains, ``--draws`` draws after
200), once with the recorded graphs simplified (:mod:`pyro_sgmcmc.models.graph_simplify`, the
package's default) and once replayed as recorded (only ``detach`` and copies of constants
removed, as before the simplification), alternating, ``--repeats`` times each in one process
after a first call of each that is not timed (imports, first recordings). The table gives the
operations of the recorded minibatch gradient, the median seconds of each, their ratio, and
whether both give the same draws bit for bit (they must).

Run: ``python benchmarks/graph_simplify.py [--problems i ii iii] [--draws 500]
[--repeats 2]``; writes ``benchmarks/results/graph_simplify.json``.
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
from _common import load_average, print_table, write_json
from ess_per_second import (
    TutorialRegression,
    hierarchical_data,
    logistic_data,
    logistic_model,
    rugged_like,
    run_ours_chains,
    varying_intercepts,
)

import pyro_sgmcmc
from pyro_sgmcmc.models import graph_capture, graph_simplify

PROBLEMS = {
    "i": (lambda: TutorialRegression(3), rugged_like, 50),
    "ii": (lambda: logistic_model, logistic_data, 500),
    "iii": (lambda: varying_intercepts, hierarchical_data, 100),
}


def as_recorded(graph, inputs, identical):
    """The recording with only ``detach`` and copies of constants removed."""
    return graph_simplify._without_identities(graph)


def run(problem: str, simplify: bool, draws: int, operations: list[int]):
    """Seconds and draws of one ``run_chains`` call; the recorded graphs' operation counts
    are appended to ``operations``."""
    make_model, make_data, batch_size = PROBLEMS[problem]
    chosen = graph_simplify.simplified if simplify else as_recorded

    def counted(graph, inputs, identical):
        graph = chosen(graph, inputs, identical)
        operations.append(sum(node.op == "call_function" for node in graph.graph.nodes))
        return graph

    graph_capture.simplified = counted
    try:
        kernel = pyro_sgmcmc.SGHMC(make_model(), batch_size=batch_size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result, seconds = run_ours_chains(kernel, make_data(), draws, 200)
    finally:
        graph_capture.simplified = graph_simplify.simplified
    return seconds, result.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for problem in args.problems:
        seconds = {True: [], False: []}
        operations = {True: [], False: []}
        draws = {}
        for simplify in (False, True):  # not timed: imports and first recordings
            run(problem, simplify, args.draws, [])
        for _ in range(args.repeats):
            for simplify in (False, True):
                elapsed, draws[simplify] = run(problem, simplify, args.draws, operations[simplify])
                seconds[simplify].append(elapsed)
        same = all(torch.equal(draws[False][k], draws[True][k]) for k in draws[False])
        before, after = statistics.median(seconds[False]), statistics.median(seconds[True])
        rows.append({
            "problem": problem,
            "operations": f"{operations[False][0]} -> {operations[True][0]}",
            "as_recorded_s": round(before, 2),
            "simplified_s": round(after, 2),
            "ratio": round(after / before, 3),
            "same_draws": same,
        })  # fmt: skip
        print(f"problem ({problem}) done", flush=True)
    columns = ["problem", "operations", "as_recorded_s", "simplified_s", "ratio", "same_draws"]
    print_table(rows, columns)
    path = write_json("graph_simplify", {"rows": rows, "load_average": load_average(),
                                         "draws": args.draws, "repeats": args.repeats})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
