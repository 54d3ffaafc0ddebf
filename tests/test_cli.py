"""End-to-end tests of ``pyro-sgmcmc compare`` in a tiny configuration, and of its bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pyro_sgmcmc.analysis import _arviz
from pyro_sgmcmc.cli.commands import main
from pyro_sgmcmc.cli.compare import MANIFEST_NAME, METHODS, CompareConfig, OutputDirectory

# Few draws and a tiny net: each run takes seconds, and checks plumbing, not statistics.
FEW = [
    "--chains", "2",
    "--hidden", "3",
    "--num-samples", "6",
    "--warmup", "8",
    "--nuts-num-samples", "6",
    "--nuts-warmup", "4",
    "--max-tree-depth", "3",
    "--nuts-init-steps", "20",
    "--steps-per-sample", "3",
    "--target-ess", "none",
    "--svi-steps", "20",
    "--no-progress",
]  # fmt: skip
# compare: in turn, as worker processes cost seconds to start (tested on their own)
TINY = [*FEW, "--jobs", "1"]

REGRESSION_METRICS = {"rmse", "log_likelihood"}
CLASSIFICATION_METRICS = {"accuracy", "nll", "ece"}
DIAGNOSTICS = {"max_rhat", "min_ess_bulk", "ess_per_second", "divergences"}


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def _check_method_outputs(out, method: str) -> None:
    # a few weights, and the network's outputs f(x) at the test inputs (what mixing is judged by)
    for suffix in ("_trace.png", "_rank.png", "_trace_fx.png", "_rank_fx.png"):
        assert (out / f"{method}{suffix}").stat().st_size > 0
    idata = _arviz.load_netcdf(out / f"{method}.nc")
    assert {"posterior", "log_likelihood", "observed_data"} <= set(_arviz.group_names(idata))
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 6
    assert "layers.0.weight" in idata.posterior


def test_compare_regression_end_to_end(tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["compare", "--dataset", "sinusoid", "--out", str(out), *TINY])
    assert code == 0
    printed = capsys.readouterr().out
    assert "test RMSE" in printed and "max R-hat" in printed and "ESS/s" in printed
    for method in METHODS:
        assert any(line.startswith(method) for line in printed.splitlines())
        _check_method_outputs(out, method)
    assert (out / "predictive_bands.png").stat().st_size > 0
    # six draws per chain converge nowhere: every sampler's row says so, SVI's says fitted
    markdown = (out / "summary.md").read_text()
    assert markdown.count("| not converged |") == len(METHODS) - 1
    assert markdown.count("| fitted |") == 1 and "| ok |" not in markdown
    assert "f(x)" in printed and "hidden units" in printed  # why the weights are not judged
    summary = _summary(out)
    assert summary["dataset"] == "sinusoid" and summary["task"] == "regression"
    assert set(summary["methods"]) == set(METHODS)
    sghmc_rate = summary["methods"]["sghmc"]["diagnostics"]["ess_per_second"]
    for method, entry in summary["methods"].items():
        assert entry["status"] == ("fitted" if method == "svi" else "not converged"), entry
        if method != "svi":
            assert "not converged: " in entry["message"] and "times longer" in entry["message"]
            # advised only where this table's own SGHMC row mixed the outputs faster
            advised = "SGHMC's momentum usually mixes the outputs" in entry["message"]
            faster = sghmc_rate > entry["diagnostics"]["ess_per_second"]
            assert advised == (method in ("sgld", "psgld") and faster), entry["message"]
        assert entry["wall_time"] > 0
        assert set(entry["metrics"]) >= REGRESSION_METRICS
        assert np.isfinite(entry["metrics"]["rmse"]) and entry["metrics"]["rmse"] > 0
        assert set(entry["diagnostics"]) >= DIAGNOSTICS
        if method != "svi":
            diagnostics = entry["diagnostics"]
            assert diagnostics["min_ess_bulk"] > 0
            # ESS/s is that of what a network is judged on, its outputs (was the weights')
            assert diagnostics["ess_per_second"] == pytest.approx(
                diagnostics["min_ess_bulk_output"] / entry["wall_time"], rel=0.05
            )
    assert "max_tree_depth=3" in summary["methods"]["nuts"]["message"]


def test_the_advice_to_use_sghmc_goes_where_the_table_refutes_it():
    """SGLD's and pSGLD's notes say SGHMC usually mixes a network faster; a comparison whose own
    SGHMC row mixed more slowly (or failed) drops that, and keeps it where SGHMC was faster."""
    from pyro_sgmcmc.analysis.advice import NETWORK_ADVICE
    from pyro_sgmcmc.cli.compare import MethodResult, _drop_refuted_advice

    def rows(sghmc_rate, sghmc_status="not converged"):
        note = "not converged: R-hat f(x) 1.3 > 1.05; run about 4 times longer"
        made = [
            MethodResult("sghmc", sghmc_status, note, diagnostics={"ess_per_second": sghmc_rate}),
            MethodResult("sgld", "not converged", note + NETWORK_ADVICE,
                         diagnostics={"ess_per_second": 2.0}),
            MethodResult("psgld", "not converged", note + NETWORK_ADVICE,
                         diagnostics={"ess_per_second": 6.0}),
        ]  # fmt: skip
        _drop_refuted_advice(made)
        return {row.method: NETWORK_ADVICE in row.message for row in made[1:]}

    assert rows(4.0) == {"sgld": True, "psgld": False}
    assert rows(8.0) == {"sgld": True, "psgld": True}
    assert rows(1.0) == {"sgld": False, "psgld": False}
    assert rows(None, "failed") == {"sgld": False, "psgld": False}


def test_compare_classification_with_a_failing_method(tmp_path, capsys):
    """A method that diverges is reported as failed; the others are still run and saved."""
    out = tmp_path / "wine"
    methods = "nuts,sgld,svi"
    args = ["compare", "--dataset", "wine", "--methods", methods, "--out", str(out), *TINY]
    # 100 non-finite steps in a row make the kernel raise SamplerDivergedError
    code = main([*args, "--sgld-lr", "1e38", "--batch-size", "16", "--steps-per-sample", "120"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "ECE" in printed
    assert "failed" in printed and "diverged" in printed
    summary = _summary(out)
    assert summary["task"] == "classification"
    assert list(summary["methods"]) == methods.split(",")
    assert summary["methods"]["sgld"]["status"] == "failed"
    assert "diverged" in summary["methods"]["sgld"]["message"]
    assert not (out / "sgld.nc").exists()
    for method in ("nuts", "svi"):
        entry = summary["methods"][method]
        assert entry["status"] in ("converged", "not converged", "fitted"), entry["message"]
        assert set(entry["metrics"]) >= CLASSIFICATION_METRICS
        assert 0 <= entry["metrics"]["accuracy"] <= 1 and 0 <= entry["metrics"]["ece"] <= 1
        assert set(entry["diagnostics"]) >= DIAGNOSTICS
        _check_method_outputs(out, method)
    assert (out / "reliability_diagram.png").stat().st_size > 0


def test_integrator_reaches_the_kernels_and_the_summary(tmp_path, monkeypatch):
    """``--integrator`` builds the SGLD and pSGLD kernels with that integrator (default
    Leimkuhler-Matthews) and is recorded in the summary's settings; ``--sgld-integrator`` is
    the same option; an unknown integrator is refused (argparse) before any work."""
    from pyro_sgmcmc.cli import compare_fit

    built = []
    original = compare_fit.SGLD

    def spy(*args, **kwargs):
        kernel = original(*args, **kwargs)
        built.append(kernel)
        return kernel

    monkeypatch.setattr(compare_fit, "SGLD", spy)
    monkeypatch.setattr(compare_fit, "PSGLD", spy)
    methods = ["--methods", "sgld,psgld", "--no-figures", *TINY]
    out = tmp_path / "euler"
    assert main(["compare", "--dataset", "linear", "--out", str(out), *methods,
                 "--integrator", "euler"]) == 0  # fmt: skip
    assert [k.options.integrator for k in built] == ["euler", "euler"]
    summary = _summary(out)
    assert summary["config"]["integrator"] == "euler"
    assert {summary["methods"][m]["status"] for m in ("sgld", "psgld")} != {"failed"}
    built.clear()
    out = tmp_path / "default"
    assert main(["compare", "--dataset", "linear", "--out", str(out), *methods]) == 0
    assert [k.options.integrator for k in built] == ["leimkuhler_matthews"] * 2
    out = tmp_path / "alias"
    built.clear()
    assert main(["compare", "--dataset", "linear", "--out", str(out), *methods,
                 "--sgld-integrator", "euler"]) == 0  # fmt: skip
    assert [k.options.integrator for k in built] == ["euler", "euler"]
    with pytest.raises(ValueError, match="integrator must be one of"):
        CompareConfig(integrator="midpoint", out=None)


def test_the_rounds_judge_a_network_where_the_table_does(tmp_path, monkeypatch):
    """With ``--target-ess`` the SG-MCMC rounds judge the network on its outputs at the test
    inputs, as the table's status does: the row says what the rounds concluded."""
    from pyro_sgmcmc.cli import compare_fit

    runs = []
    original = compare_fit.run_chains

    def spy(*args, **kwargs):
        runs.append((kwargs, original(*args, **kwargs)))
        return runs[-1][1]

    monkeypatch.setattr(compare_fit, "run_chains", spy)
    budget = [a for a in TINY if a != "none"]
    budget[budget.index("--target-ess") + 1 : budget.index("--target-ess") + 1] = ["50"]
    out = tmp_path / "rounds"
    assert main(["compare", "--dataset", "sinusoid", "--methods", "sghmc", "--no-figures",
                 "--out", str(out), *budget, "--max-seconds", "2"]) == 0  # fmt: skip
    [(kwargs, result)] = runs
    assert kwargs["target_ess"] == 50 and kwargs["test"][0].shape == (200, 1)
    entry = _summary(out)["methods"]["sghmc"]
    assert entry["status"] == ("converged" if result.verdict.converged else "not converged")
    # a row that did not converge says that its budget stopped it
    spent = "--max-seconds 2 spent before it converged" in entry["message"]
    assert spent == (not result.verdict.converged)


def test_compare_exits_1_when_every_method_fails(tmp_path, capsys):
    out = tmp_path / "fail"
    args = ["compare", "--dataset", "linear", "--methods", "sgld", "--out", str(out), *TINY]
    assert main([*args, "--sgld-lr", "1e38", "--steps-per-sample", "120", "--no-figures"]) == 1
    assert "every method failed" in capsys.readouterr().err
    assert _summary(out)["methods"]["sgld"]["status"] == "failed"


def test_methods_run_at_once_match_a_run_in_turn_draw_for_draw(tmp_path, capsys):
    """``--jobs 2`` runs the methods in two worker processes: the rows keep the order of
    ``--methods``, a method that fails in its worker is reported like any failure, and every
    other method's draws equal those of the same run in turn bit for bit (same seeds)."""
    methods = "sgld,svi,sghmc"
    args = ["--dataset", "linear", "--methods", methods, *TINY, "--sgld-lr", "1e38"]
    args += ["--steps-per-sample", "120", "--no-figures"]
    outputs = {}
    for jobs in ("1", "2"):
        outputs[jobs] = tmp_path / f"jobs{jobs}"
        assert main(["compare", *args, "--out", str(outputs[jobs]), "--jobs", jobs]) == 0
    assert "in a worker process, 2 at a time" in capsys.readouterr().err
    settings = (outputs["2"] / "summary.md").read_text()
    assert "2 methods at a time, each in its own process with 1 torch thread(s)" in settings
    in_turn, at_once = _summary(outputs["1"]), _summary(outputs["2"])
    assert list(at_once["methods"]) == methods.split(",")
    assert at_once["methods"]["sgld"]["status"] == "failed"
    assert "diverged" in at_once["methods"]["sgld"]["message"]
    for method in ("svi", "sghmc"):
        assert at_once["methods"][method]["status"] == in_turn["methods"][method]["status"]
        first = _arviz.load_netcdf(outputs["1"] / f"{method}.nc").posterior
        second = _arviz.load_netcdf(outputs["2"] / f"{method}.nc").posterior
        for name in first.data_vars:
            np.testing.assert_array_equal(first[name].values, second[name].values)


def test_jobs_are_checked_and_default_to_one_per_core(monkeypatch):
    from pyro_sgmcmc.cli import compare_jobs

    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        CompareConfig(jobs=0, out=None)
    with pytest.raises(ValueError, match=r"jobs must be 1 with distributed='chains'"):
        CompareConfig(jobs=2, distributed="chains", methods=("sgld",), out=None)
    monkeypatch.setattr(compare_jobs, "usable_cores", lambda: 2)
    assert compare_jobs.default_jobs(CompareConfig(out=None)) == 2
    assert compare_jobs.default_jobs(CompareConfig(methods=("svi",), out=None)) == 1
    assert compare_jobs.default_jobs(CompareConfig(threads=2, out=None)) == 1
    monkeypatch.setattr(compare_jobs, "usable_cores", lambda: 64)
    assert compare_jobs.default_jobs(CompareConfig(out=None)) == len(METHODS)
    chains = CompareConfig(distributed="chains", methods=("sgld", "sghmc"), out=None)
    assert compare_jobs.default_jobs(chains) == 1


def test_a_worker_that_dies_fails_its_method_only(capsys):
    """A worker process that ends abruptly (killed, out of memory) is its method's failure."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from pyro_sgmcmc.cli import compare_jobs

    future: Future = Future()
    future.set_exception(BrokenProcessPool("A process in the process pool was terminated"))
    outcome = compare_jobs._collect(future, None, "nuts", print)
    assert outcome.result.status == "failed" and outcome.idata is None
    assert "BrokenProcessPool in its worker process" in outcome.result.message
    assert "[nuts] failed: BrokenProcessPool" in capsys.readouterr().out


def test_a_time_budget_skips_the_methods_not_started_with_jobs(tmp_path, capsys):
    args = ["compare", "--dataset", "linear", "--methods", "sgld,svi", *TINY, "--jobs", "2"]
    assert main([*args, "--time-budget", "1e-9", "--no-output"]) == 1
    phases = capsys.readouterr().err
    assert phases.count("skipped: time budget spent") == 2 and "worker process" not in phases


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "mnist"], "--dataset must be one of linear, sinusoid"),
        (["--dataset", "bimodal"], "dataset must be one of"),
        (["--methods", "nuts,hmc"], "--methods: unknown method(s) 'hmc'; valid ones are nuts"),
        (["--methods", "nuts,nuts"], "must not repeat"),
        (["--chains", "0"], "--chains must be an integer >= 1"),
        (["--num-samples", "-3"], "--num-samples must be an integer >= 1"),
        (["--friction", "1.5"], "--friction must lie in (0.0, 1.0]"),
        (["--integrator", "midpoint"], "argument --integrator/--sgld-integrator: invalid choice"),
        (["--sgld-lr", "0"], "--sgld-lr must be > 0"),
        (["--activation", "cosh"], "--activation must be one of tanh"),
        (["--prior", "laplace"], "prior must be one of normal"),
        (["--noise", "student"], "noise must be one of auto"),
        (["--hidden", "4,x"], "argument --hidden"),
        (["--hidden", "8,,8"], "argument --hidden: expected integers such as 16,16, got an empty"),
        (["--methods", "sghmc,"], "argument --methods: expected method names, got an empty entry"),
        (["--max-tree-depth", "40"], "--max-tree-depth must lie in"),
        (["--test-fraction", "1"], "--test-fraction must lie in"),
        (["--time-budget", "-1"], "--time-budget must be > 0"),
        (["--batch-size", "many"], "argument --batch-size: invalid int value"),
        (
            ["--warmup", "0", "--methods", "sghmc,svi"],
            "--warmup 0: the step size of sghmc is adapted during warm-up, which needs at least 20",
        ),
        (
            ["--warmup", "3", "--steps-per-sample", "2", "--methods", "sgld", "psgld"],
            "--warmup 3 x --steps-per-sample 2 = 6 steps: the step size of sgld, psgld",
        ),
    ],
)
def test_bad_arguments_exit_2_before_any_work(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--out", str(tmp_path / "never"), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_unwritable_output_directory_is_reported_before_sampling(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    assert main(["compare", "--out", str(blocker / "results"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and "a_file" in err


def test_missing_fashion_mnist_files_exit_2(tmp_path, capsys):
    args = ["compare", "--dataset", "fashion_mnist", "--data-dir", str(tmp_path / "none")]
    assert main([*args, "--out", str(tmp_path / "out"), *TINY]) == 2
    assert "apt-get install dataset-fashion-mnist" in capsys.readouterr().err


def test_no_command_and_datasets_listing(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert main(["datasets"]) == 0
    listing = capsys.readouterr().out
    assert "sinusoid" in listing and "breast_cancer   classification" in listing


def test_config_is_usable_from_python():
    config = CompareConfig(dataset="wine", methods=["sghmc", "svi"], hidden=[4], out=None)
    assert config.methods == ("sghmc", "svi") and config.hidden == (4,)
    assert config.task == "classification"
    assert config.to_dict()["methods"] == ["sghmc", "svi"]
    assert CompareConfig(out=None).dataset == "sinusoid"
    with pytest.raises(ValueError, match="methods must name at least one"):
        CompareConfig(methods=())
    with pytest.raises(ValueError, match="out must name a directory, got an empty string"):
        CompareConfig(out="")
    with pytest.raises(ValueError, match=r"target must name the column of 't\.csv' to predict"):
        CompareConfig(data="t.csv")
    with pytest.raises(ValueError, match="task: the data set 'wine' is a classification set"):
        CompareConfig(dataset="wine", task="regression")


# --------------------------------------------------------------------------- your own data


def _write_table(path, rows, header) -> None:
    lines = [",".join(header)] + [",".join(map(str, row)) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def _regression_csv(path, n=40) -> None:
    rng = np.random.default_rng(0)
    x1, x2 = rng.uniform(-2, 2, n), rng.normal(size=n)
    y = np.sin(x1) + 0.3 * x2 + 0.1 * rng.normal(size=n)
    _write_table(path, zip(x1, x2, y, strict=True), ["x1", "x2", "y"])


def _classification_csv(path, n=45) -> None:
    rng = np.random.default_rng(1)
    x1, x2 = rng.uniform(-2, 2, n), rng.normal(size=n)
    label = np.where(x1 > 0.7, "high", np.where(x1 < -0.7, "low", "mid"))
    _write_table(path, zip(x1, x2, label, strict=True), ["x1", "x2", "label"])


def test_compare_on_your_own_csv_regression(tmp_path, capsys):
    table = tmp_path / "measurements.csv"
    _regression_csv(table)
    out = tmp_path / "results"
    code = main(["compare", "--data", str(table), "--target", "y", "--out", str(out), *TINY])
    assert code == 0
    captured = capsys.readouterr()
    assert "measurements (regression): 32 train / 8 test rows" in captured.out
    assert "inferred: numeric target" in captured.err
    for method in METHODS:
        _check_method_outputs(out, method)
    assert (out / "predicted_vs_observed.png").stat().st_size > 0
    summary = _summary(out)
    assert summary["dataset"] == "measurements" and summary["task"] == "regression"
    assert summary["config"]["data"] == str(table) and summary["config"]["target"] == "y"
    for entry in summary["methods"].values():
        assert entry["status"] in ("not converged", "fitted"), entry["message"]
        assert np.isfinite(entry["metrics"]["rmse"]) and set(entry["diagnostics"]) >= DIAGNOSTICS
    idata = _arviz.load_netcdf(out / "nuts.nc")
    assert idata.observed_data["obs"].shape == (32,)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == sorted(
        p.name for p in out.iterdir() if p.name != MANIFEST_NAME
    )


def test_compare_on_your_own_csv_classification(tmp_path, capsys):
    table = tmp_path / "levels.csv"
    _classification_csv(table)
    out = tmp_path / "results"
    args = ["compare", "--data", str(table), "--target", "label", "--methods", "sgld,svi"]
    assert main([*args, "--out", str(out), *TINY]) == 0
    assert "levels (classification)" in capsys.readouterr().out
    summary = _summary(out)
    assert summary["task"] == "classification"
    for method in ("sgld", "svi"):
        assert set(summary["methods"][method]["metrics"]) >= CLASSIFICATION_METRICS
        _check_method_outputs(out, method)
    assert (out / "reliability_diagram.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("table", "args", "message"),
    [
        ("a,b,y\n1,2,3\n4,,6\n7,8,9\n1,1,1\n", [], "missing values, column 'b': 1 (line 3)"),
        ("a,b,y\nred,2,3\nblue,5,6\nred,8,9\n", [], "feature column(s) 'a' (e.g. 'red')"),
        ("a,y\n1,k\n2,k\n3,k\n", [], "target column 'y' has a single class ('k')"),
        ("a,y\n1,2\n2,3\n3,4\n", ["--target", "z"], "target column 'z' is not in"),
        ("a,y\n1,2.5\n2,3\n3,4\n", ["--task", "classification"], "non-integer values"),
    ],
)
def test_bad_data_files_exit_2_with_a_named_error(tmp_path, capsys, table, args, message):
    path = tmp_path / "table.csv"
    path.write_text(table)
    target = [] if "--target" in args else ["--target", "y"]
    out = tmp_path / "never"
    assert main(["compare", "--data", str(path), *target, *args, "--out", str(out), *TINY]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "t.csv"], "target must name the column of 't.csv' to predict"),
        (["--target", "y"], "target names a column of data: give data (--data FILE) too"),
        (["--data", "t.csv", "--target", "y", "--dataset", "wine"], "give either dataset"),
        (["--data", ""], "argument --data: expected a file name, got an empty string"),
        (["--data", "t.csv", "--target", "y", "--task", "ordinal"], "invalid choice: 'ordinal'"),
        (["--dataset", "wine", "--task", "regression"], "is a classification set"),
    ],
)
def test_data_arguments_are_checked_before_any_work(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", *args, "--no-output"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- output directory

FAST = [*TINY, "--no-figures"]


def test_output_directory_that_compare_did_not_write_is_refused(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("do not lose me")
    args = ["compare", "--dataset", "linear", "--methods", "sgld", "--out", str(out)]
    assert main([*args, *FAST]) == 2
    err = capsys.readouterr().err
    assert "not empty and was not written by pyro-sgmcmc" in err and "thesis.tex" in err
    assert "--overwrite" in err and "(--overwrite True)" not in err  # said once, as a flag
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    # --overwrite writes the results, leaves the foreign file and replaces one named like ours
    (out / "sgld.nc").write_text("an old result")
    assert main([*args, "--overwrite", "--quiet", *FAST]) == 0  # said among the notes, even so
    assert "left in place files pyro-sgmcmc did not write: thesis.tex" in capsys.readouterr().out
    assert (out / "thesis.tex").read_text() == "do not lose me"
    assert _arviz.load_netcdf(out / "sgld.nc").posterior.sizes["draw"] == 6
    assert "thesis.tex" not in json.loads((out / MANIFEST_NAME).read_text())["files"]


def test_a_rerun_leaves_no_stale_results(tmp_path):
    out = tmp_path / "results"
    args = ["compare", "--dataset", "linear", "--out", str(out), *TINY]
    assert main([*args, "--methods", "sgld,svi"]) == 0
    assert {"sgld.nc", "sgld_trace.png", "svi.nc", "predictive_bands.png"} <= {
        p.name for p in out.iterdir()
    }
    # the second run into the same directory is allowed (it holds our manifest) and replaces it
    assert main([*args, "--methods", "svi", "--no-figures"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST_NAME, "svi.nc", "summary.json", "summary.md"]
    )
    assert list(_summary(out)["methods"]) == ["svi"]
    # a file added by hand to a directory we wrote makes it foreign again
    (out / "notes.txt").write_text("mine")
    assert main([*args, "--methods", "svi", "--no-figures"]) == 2
    assert (out / "svi.nc").exists()


def test_manifest_never_reaches_outside_its_directory(tmp_path):
    outside = tmp_path / "precious.nc"
    outside.write_text("keep")
    out = tmp_path / "results"
    out.mkdir()
    manifest = {"tool": "pyro-sgmcmc", "files": ["../precious.nc", "old.png"]}
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    (out / "old.png").write_text("stale")
    directory = OutputDirectory.prepare(out)
    assert outside.read_text() == "keep" and not (out / "old.png").exists()
    assert directory.claim("a.nc") == out / "a.nc"
    assert json.loads((out / MANIFEST_NAME).read_text())["files"] == ["a.nc"]
    with pytest.raises(ValueError, match="plain file name"):
        directory.claim("../b.nc")
    (out / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(FileExistsError, match="is not a valid manifest"):
        OutputDirectory.prepare(out)


def test_results_of_a_version_without_manifests_are_replaced(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    summary = {"dataset": "sinusoid", "config": {}, "methods": {"nuts": {}}}
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "nuts.nc").write_text("old draws")
    (out / "nuts_trace.png").write_text("old figure")
    directory = OutputDirectory.prepare(out)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_NAME] and directory.kept == []
    # a summary.json that compare did not write does not make the directory ours
    (out / MANIFEST_NAME).unlink()
    (out / "summary.json").write_text(json.dumps({"accuracy": 0.9}))
    with pytest.raises(FileExistsError, match=r"it holds summary\.json and no"):
        OutputDirectory.prepare(out)


def test_empty_out_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--out", "", *TINY])
    assert exit_info.value.code == 2
    assert "argument --out: expected a directory, got an empty string" in capsys.readouterr().err


# --------------------------------------------------------------------------- sample


def test_sample_writes_one_inference_data(tmp_path, capsys):
    table = tmp_path / "measurements.csv"
    _regression_csv(table)
    output = tmp_path / "fit.nc"
    args = ["sample", "sghmc", "--data", str(table), "--target", "y", "-o", str(output), *FEW]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "measurements (regression)" in printed and "sghmc" in printed and "test RMSE" in printed
    idata = _arviz.load_netcdf(output)
    groups = set(_arviz.group_names(idata))
    assert {"posterior", "log_likelihood", "observed_data", "predictions"} <= groups
    assert idata.posterior.attrs["method"] == "sghmc"
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 6
    # an existing file is refused unless --overwrite, before anything runs
    assert main(args) == 2
    assert "exists; choose another file or pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--seed", "1"]) == 0


def test_sample_on_a_built_in_set_and_its_bad_arguments(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sample", "svi", "--dataset", "wine", *FEW]) == 0
    assert _arviz.load_netcdf(tmp_path / "svi.nc").posterior.attrs["method"] == "svi"
    assert "accuracy" in capsys.readouterr().out
    assert main(["sample", "sgld", "-o", "result.txt", *FEW]) == 2
    assert "must be a netCDF file ending in .nc" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sample", "hmc", *FEW])
    assert "argument METHOD: invalid choice: 'hmc'" in capsys.readouterr().err
    # another method's option is ignored, and the command says so
    other = ["--psgld-lr", "0.1", "-o", "b.nc"]
    assert main(["sample", "svi", "--dataset", "wine", *other, *FEW]) == 0
    err = capsys.readouterr().err
    assert "warning: --psgld-lr (applies to psgld), --nuts-num-samples (applies to nuts)" in err
    assert "ignored: svi does not use them" in err and "--svi-steps" not in err


def test_sample_exits_1_when_the_method_fails(tmp_path, capsys):
    output = tmp_path / "fail.nc"
    args = ["sample", "sgld", "--dataset", "linear", "-o", str(output), *FEW]
    assert main([*args, "--sgld-lr", "1e38", "--steps-per-sample", "120"]) == 1
    assert "diverged" in capsys.readouterr().out
    assert not output.exists()


def test_sample_says_when_the_kept_draws_diverged(tmp_path, capsys):
    """A step size that diverges on every step leaves the chains at their start: the run still
    writes its file, and the results say why its numbers are poor and what to change."""
    output = tmp_path / "stuck.nc"
    args = ["sample", "sghmc", "-o", str(output), *FEW, "--sghmc-lr", "0.1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "every kept draw had a divergent step" in printed
    assert "give a smaller --sghmc-lr, or leave it unset" in printed
    assert _arviz.load_netcdf(output).sample_stats["diverging"].values.all()
    # a step that works gets no such note
    assert main([*args[:3], str(tmp_path / "fine.nc"), *FEW, "--sghmc-lr", "0.001"]) == 0
    assert "divergent step" not in capsys.readouterr().out


# --------------------------------------------------------------------------- matplotlib


def test_importing_the_package_leaves_the_matplotlib_backend_alone(tmp_path):
    """``import pyro_sgmcmc`` and the figures of ``compare`` never switch the caller's backend."""
    script = f"""
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
import pyro_sgmcmc, pyro_sgmcmc.analysis.plots, pyro_sgmcmc.cli.commands
from pyro_sgmcmc.cli.compare import CompareConfig, run_comparison
config = CompareConfig(dataset="linear", methods=("sgld",), hidden=(3,), num_samples=6,
                       warmup=8, num_steps_per_sample=3, target_ess=None, progress=False,
                       out={str(tmp_path)!r})
run_comparison(config)
print(matplotlib.get_backend(), len(plt.get_fignums()))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.split() == ["svg", "0"]
    assert (tmp_path / "sgld_trace.png").stat().st_size > 0


def test_a_message_naming_an_option_in_both_forms_names_its_flag_once():
    """The configuration's messages give the Python argument and the flag; on the command line
    the argument becomes the flag, which was then said twice."""
    import argparse

    from pyro_sgmcmc.cli.commands import _in_flags

    parser = argparse.ArgumentParser()
    parser.add_argument("--task")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--batch-size")
    cases = {
        "use task='regression' (--task regression)": "use --task regression",
        "pass --overwrite (overwrite=True)": "pass --overwrite",
        "a number (task='regression', --task regression)?": "a number (--task regression)?",
        "batch_size must be > 0 (got 0)": "--batch-size must be > 0 (got 0)",
    }
    for message, expected in cases.items():
        assert _in_flags(message, parser) == expected


def test_methods_may_be_given_apart_or_comma_separated():
    from pyro_sgmcmc.cli.commands import build_parser

    parser = build_parser()
    for given in (["sghmc", "svi"], ["sghmc,svi"], ["svi", "sghmc"], ["svi,sghmc"]):
        methods = parser.parse_args(["compare", "--methods", *given]).methods
        assert sorted(methods) == ["sghmc", "svi"]
