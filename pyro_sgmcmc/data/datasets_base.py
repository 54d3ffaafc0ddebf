"""The :class:`Dataset` container, and how every data set is split and standardised.

One job: turn arrays of inputs and targets into a frozen :class:`Dataset` of torch tensors:
a seeded (stratified) train/test split, optional caps on the row counts, standardisation with
the training statistics, and the checks of the split arguments shared by
:func:`pyro_sgmcmc.data.datasets.load_dataset` and :func:`pyro_sgmcmc.data.datasets.load_table`. The
built-in sets (:mod:`.datasets_builtin`) and your own tables (:mod:`.datasets_table`) both end
here; the public entry point is :mod:`pyro_sgmcmc.data.datasets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from .._validation import check_interval, check_positive_int

__all__ = ["Dataset", "Task"]

Task = Literal["regression", "classification"]


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


def _check_task(task: Any) -> None:
    """``task`` must be ``None``, ``"regression"`` or ``"classification"``."""
    if task not in (None, "regression", "classification"):
        raise ValueError(f"task must be None, 'regression' or 'classification', got {task!r}")


def _check_split_arguments(
    seed: int, test_fraction: float, max_train: int | None, max_test: int | None
) -> tuple[int, float, int | None, int | None]:
    """The checked ``seed``, ``test_fraction``, ``max_train`` and ``max_test`` of a split."""
    seed = check_positive_int("seed", seed, minimum=0)
    test_fraction = check_interval(
        "test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True
    )
    if max_train is not None:
        max_train = check_positive_int("max_train", max_train, minimum=2)
    if max_test is not None:
        max_test = check_positive_int("max_test", max_test)
    return seed, test_fraction, max_train, max_test
