"""End-to-end tests of ``pyro-sgmcmc compare`` in a tiny configuration, and of its bad inputs."""

from __future__ import annotations

import json

import arviz as az
import numpy as np
import pytest

from pyro_sgmcmc.cli import main
from pyro_sgmcmc.compare import METHODS, CompareConfig

# Few draws and a tiny net: each run takes seconds, and checks plumbing, not statistics.
TINY = [
    "--chains", "2",
    "--hidden", "3",
    "--num-samples", "6",
    "--warmup", "4",
    "--nuts-num-samples", "6",
    "--nuts-warmup", "4",
    "--max-tree-depth", "3",
    "--steps-per-sample", "3",
    "--svi-steps", "20",
    "--no-progress",
]  # fmt: skip

REGRESSION_METRICS = {"rmse", "log_likelihood"}
CLASSIFICATION_METRICS = {"accuracy", "nll", "ece"}
DIAGNOSTICS = {"max_rhat", "min_ess_bulk", "ess_per_second", "divergences"}


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def _check_method_outputs(out, method: str) -> None:
    for suffix in ("_trace.png", "_rank.png"):
        assert (out / f"{method}{suffix}").stat().st_size > 0
    idata = az.from_netcdf(out / f"{method}.nc")
    assert {"posterior", "log_likelihood", "observed_data"} <= set(idata.groups())
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
    assert (out / "summary.md").read_text().count("| ok |") == len(METHODS)
    summary = _summary(out)
    assert summary["dataset"] == "sinusoid" and summary["task"] == "regression"
    assert set(summary["methods"]) == set(METHODS)
    for method, entry in summary["methods"].items():
        assert entry["status"] == "ok", entry["message"]
        assert entry["wall_time"] > 0
        assert set(entry["metrics"]) >= REGRESSION_METRICS
        assert np.isfinite(entry["metrics"]["rmse"]) and entry["metrics"]["rmse"] > 0
        assert set(entry["diagnostics"]) >= DIAGNOSTICS
        if method != "svi":
            assert entry["diagnostics"]["min_ess_bulk"] > 0
    assert "max_tree_depth=3" in summary["methods"]["nuts"]["message"]


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
        assert entry["status"] == "ok", entry["message"]
        assert set(entry["metrics"]) >= CLASSIFICATION_METRICS
        assert 0 <= entry["metrics"]["accuracy"] <= 1 and 0 <= entry["metrics"]["ece"] <= 1
        assert set(entry["diagnostics"]) >= DIAGNOSTICS
        _check_method_outputs(out, method)
    assert (out / "reliability_diagram.png").stat().st_size > 0


def test_compare_exits_1_when_every_method_fails(tmp_path, capsys):
    out = tmp_path / "fail"
    args = ["compare", "--dataset", "linear", "--methods", "sgld", "--out", str(out), *TINY]
    assert main([*args, "--sgld-lr", "1e38", "--steps-per-sample", "120", "--no-figures"]) == 1
    assert "every method failed" in capsys.readouterr().err
    assert _summary(out)["methods"]["sgld"]["status"] == "failed"


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "mnist"], "dataset must be one of linear, sinusoid"),
        (["--dataset", "bimodal"], "dataset must be one of"),
        (["--methods", "nuts,hmc"], "unknown method(s) 'hmc'; valid ones are nuts, sghmc"),
        (["--methods", "nuts,nuts"], "must not repeat"),
        (["--chains", "0"], "chains must be an integer >= 1"),
        (["--num-samples", "-3"], "num_samples must be an integer >= 1"),
        (["--friction", "1.5"], "friction must lie in (0.0, 1.0]"),
        (["--sgld-lr", "0"], "sgld_learning_rate must be > 0"),
        (["--activation", "cosh"], "activation must be one of tanh"),
        (["--prior", "laplace"], "prior must be one of normal"),
        (["--noise", "student"], "noise must be one of gamma"),
        (["--hidden", "4,x"], "argument --hidden"),
        (["--max-tree-depth", "40"], "max_tree_depth must lie in"),
        (["--test-fraction", "1"], "test_fraction must lie in"),
        (["--time-budget", "-1"], "time_budget must be > 0"),
        (["--batch-size", "many"], "argument --batch-size: invalid int value"),
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
    with pytest.raises(ValueError, match="methods must name at least one"):
        CompareConfig(methods=())
