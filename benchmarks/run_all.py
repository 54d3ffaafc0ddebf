"""Summary of the performance benchmarks: one table from the JSON files in ``results/``.

Reads what ``step_overhead.py`` (W1), ``engine_overhead.py`` (W2 engine step against another
checkout, when run), ``w1g_pyro_module.py`` (W1g), ``w2_small_bnn.py`` (W2),
``w3_fashion_mnist.py`` (W3), ``w4_known_posterior.py`` (W4), ``w5_lenet.py`` (W5),
``w7_distributed.py`` (W7) and ``uci_regression.py`` last wrote, and prints workload, ours,
baseline, ratio, target and pass/fail with the load average at measurement time (timings under
load > CPU count are inflated). It runs nothing itself, so it is cheap; run the scripts first
(``nox -s benchmarks`` runs the others in alphabetical order, then this one).

Run: ``python benchmarks/run_all.py``; writes ``results/summary.json``.
"""

from __future__ import annotations

import json

from _common import RESULTS, print_table, write_json

COLUMNS = ["workload", "ours", "baseline", "ratio", "target", "pass", "load"]


def _read(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main() -> None:
    rows: list[dict] = []
    w1 = _read("step_overhead")
    if w1:
        base = sorted(w1["baseline_s_per_step"])[len(w1["baseline_s_per_step"]) // 2]
        fast = sorted(w1["sghmc_fast_s_per_step"])[len(w1["sghmc_fast_s_per_step"]) // 2]
        ratio = f"{w1['ratio_fast']:.2f}"
        if w1.get("ratio_fast_vs_index_select_baseline"):  # SGD with the same row gather
            ratio += f" ({w1['ratio_fast_vs_index_select_baseline']:.2f} vs index_select SGD)"
        rows.append({"workload": "W1 ms per step", "ours": f"{1e3 * fast:.2f}",
                     "baseline": f"SGD {1e3 * base:.2f}", "ratio": ratio,
                     "target": f"<= {w1['target']}", "pass": w1["ratio_fast"] <= w1["target"],
                     "load": w1.get("load_average", "not recorded")})  # fmt: skip
    for name in ("w2_small_bnn", "w3_fashion_mnist", "w4_known_posterior"):
        result = _read(name)
        if result is None:
            rows.append({"workload": name, "ours": "not run"})
            continue
        load = result.get("load_average_end") or (result.get("runs") or [{}])[-1].get(
            "load_average", "not recorded"
        )
        for row in result.get("rows", []):
            ours = row.get("ours") or row.get("ours acc/NLL/ECE")
            if ours is None and row.get("sampling s"):  # W2: sampling and total seconds
                ours = f"{row['sampling s']} s"
                if row.get("total s"):
                    ours += f", total {row['total s']} s"
            rows.append(
                {
                    "workload": row["workload"],
                    "ours": ours,
                    "baseline": row.get("baseline") or row.get("SGD same time", ""),
                    "ratio": row.get("ratio", ""),
                    "target": row.get("target", ""),
                    "pass": row.get("pass"),
                    "load": load,
                }
            )
    rows += _engine_rows() + _w1g_rows() + _w5_rows() + _w7_rows() + _uci_rows()
    print_table(rows, COLUMNS)
    write_json("summary", {"rows": rows})


def _engine_rows() -> list[dict]:
    result = _read("engine_overhead")
    if result is None:  # needs another checkout (--against), so it is often not run
        return []
    ours, theirs = result["rows"]
    return [
        {"workload": "W2 engine step, 8 chains, vs " + theirs["tree"],
         "ours": ours["s per 1000 steps (median of rounds)"] + " s / 1000 steps",
         "baseline": theirs["s per 1000 steps (median of rounds)"], "ratio":
         f"{result['ratio']:.3f}", "target": "<= 1 (no regression)", "pass": result["ratio"] <= 1.0,
         "load": result.get("load_average", "not recorded")}
    ]  # fmt: skip


def _w1g_rows() -> list[dict]:
    result = _read("w1g_pyro_module")
    if result is None:
        return [{"workload": "w1g_pyro_module", "ours": "not run"}]
    targets, load = result["targets"], result.get("load_average", "not recorded")
    return [
        {"workload": "W1g PyroModule 784-100-10, SGHMC step vs torch SGD step",
         "ratio": f"{result['ratio_step']:.2f}", "target": f"<= {targets['step']}",
         "pass": result["ratio_step"] <= targets["step"], "load": load},
        {"workload": f"W1g {result['chains']} chains in run_chains vs 1",
         "ratio": f"{result['ratio_chains']:.2f}", "target": f"<= {targets['chains']}",
         "pass": result["ratio_chains"] <= targets["chains"], "load": load},
    ]  # fmt: skip


def _w5_rows() -> list[dict]:
    result = _read("w5_lenet")
    if result is None:
        return [{"workload": "w5_lenet", "ours": "not run"}]
    return [
        {"workload": f"W5 {row['row']}", "ours": row.get("acc / NLL / ECE") or row.get("result"),
         "ratio": row.get("ratio", ""), "target": row.get("target", ""), "pass": row.get("pass"),
         "load": result.get("load_average_end", "not recorded")}
        for row in result.get("rows", [])
    ]  # fmt: skip


def _w7_rows() -> list[dict]:
    result = _read("w7_distributed")
    if result is None:
        return [{"workload": "w7_distributed", "ours": "not run"}]
    return [
        {"workload": f"W7 {row['workload']}, 2 ranks vs 1 (s per draw)",
         "ours": row["2 ranks s/draw"], "baseline": row["1 rank s/draw"],
         "ratio": row["ratio 2/1"], "target": "<= 0.6" if row["workload"] != "linreg/data" else "",
         "pass": float(row["ratio 2/1"]) <= 0.6 if row["workload"] != "linreg/data" else None,
         "load": result.get("load_average_after", "not recorded")}
        for row in result.get("rows", [])
    ]  # fmt: skip


def _uci_rows() -> list[dict]:
    result = _read("uci_regression")
    if result is None:
        return [{"workload": "uci_regression", "ours": "not run"}]
    return [
        {"workload": f"UCI {row['dataset']} ({row['splits']} splits), defaults",
         "ours": f"RMSE {row['rmse']}, LL {row['test ll']}", "baseline": row["MC dropout"],
         "pass": row["pass"], "load": result.get("load_average", "not recorded")}
        for row in result.get("summary", [])
    ]  # fmt: skip


if __name__ == "__main__":
    main()
