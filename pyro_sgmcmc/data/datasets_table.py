"""Your own data: read a table (CSV, NPZ or Parquet), check it, and split it like a built-in set.

One job: :func:`load_table`. The readers turn a file into named columns (numbers, or text where
a cell is not a number); the checks name each problem of a table (its columns, missing or
infinite values, a target that cannot serve the task); the task is given or inferred from the
target column, class labels are encoded ``0..K-1``, and the rows go through the same split and
standardisation as the built-in sets (:func:`.datasets_base._tabular`).
:mod:`pyro_sgmcmc.data.datasets` re-exports the public names.
"""

from __future__ import annotations

import importlib.util
import os
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .datasets_base import Dataset, Task, _check_split_arguments, _check_task, _tabular

__all__ = ["MAX_INFERRED_CLASSES", "MISSING_TOKENS", "TABLE_FORMATS", "load_table"]

#: A classification split whose test share differs from ``test_fraction`` by more than this is
#: reported.
SPLIT_DRIFT = 0.05

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

    delimiter = _csv_delimiter(path)
    with path.open(newline="", encoding="utf-8-sig") as handle:
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
                f"(delimiter {delimiter!r}){_split_decimal_hint(row, header, delimiter)}"
            )
    return [_column_from_cells(name, [row[j] for row in body]) for j, name in enumerate(header)]


def _split_decimal_hint(row: list[str], header: list[str], delimiter: str) -> str:
    """Where a ``,`` CSV row has too many fields and enough pairs of neighbouring cells read as
    the two halves of a number with a decimal comma (``3,25`` split into ``3`` and ``25``) to
    account for the extra fields, the possible cause: unquoted decimal commas, which no reader
    can tell from the delimiter. Not for a row that ends on an empty field (a trailing comma)."""
    extra = len(row) - len(header)
    if delimiter != "," or extra <= 0 or not row[-1].strip():
        return ""
    halves, j = [], 0
    while j + 1 < len(row):
        left, right = row[j].strip(), row[j + 1].strip()
        if _INTEGER_PART.fullmatch(left) and right.isdigit():
            halves.append(f"{left},{right}")
            j += 2
        else:
            j += 1
    if len(halves) < extra:
        return ""
    return (
        f". If the file writes numbers with a decimal comma (is {halves[0]!r} one number?), the "
        "decimal mark and the delimiter cannot be told apart: save it again with ';' as the "
        "delimiter (a spreadsheet's 'CSV (semicolon)'; loaded as it is, the numbers are then "
        "named with a fix) or with '.' as the decimal mark"
    )


def _csv_delimiter(path: Path) -> str:
    """The delimiter of a CSV file: tab for ``.tsv``, else ``,``, ``;`` or tab as detected on
    the header line (``,`` if none is)."""
    import csv

    if path.suffix.lower() == ".tsv":
        return "\t"
    with path.open(newline="", encoding="utf-8-sig") as handle:
        header = handle.read(64 * 1024).split("\n", 1)[0]
    try:
        return csv.Sniffer().sniff(header, ",;\t").delimiter
    except csv.Error:
        return ","


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


#: A cell holding a number written with a decimal comma: ``1,5``, ``-0,25``, ``2,5e-3``, and
#: ``1.234,5`` (points between the thousands).
_DECIMAL_COMMA = re.compile(r"[+-]?(\d+|\d{1,3}(\.\d{3})+),\d+([eE][+-]?\d+)?")
#: A decimal-comma cell with points between the thousands (``1.234,5``).
_THOUSANDS_POINTS = re.compile(r"[+-]?\d{1,3}(\.\d{3})+,")
#: The integer part of a number whose decimal comma an unquoted ``,`` CSV split off.
_INTEGER_PART = re.compile(r"[+-]?\d+")


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _decimal_comma_cells(column: _Column) -> list[str] | None:
    """The cells of a text column written as numbers with a decimal comma (``None`` unless every
    cell that is not missing is such a number or a plain number, and one at least is)."""
    if column.numeric:
        return None
    cells = [v for v in column.values if v is not None]
    comma = [v for v in cells if _DECIMAL_COMMA.fullmatch(v)]
    if not comma:
        return None
    if len(comma) < len(cells) and not all(
        _DECIMAL_COMMA.fullmatch(v) or _is_number(v) for v in cells
    ):
        return None
    return comma


def _check_decimal_commas(
    path: Path, kind: str, columns: list[_Column], target: str, task: Task | None
) -> None:
    """Refuse columns of numbers written with a decimal comma (``1,5``), which the readers take
    for text: as features they would be refused as categories, as a target read as class
    labels. A target is left alone when ``task='classification'`` says its values are labels."""
    found = {}
    for c in columns:
        if c.name == target and task == "classification":
            continue
        cells = _decimal_comma_cells(c)
        if cells is not None:
            found[c.name] = cells
    if not found:
        return
    names = ", ".join(f"{name!r} (e.g. {cells[0]!r})" for name, cells in found.items())
    cells = [cell for column in found.values() for cell in column]
    thousands = any(_THOUSANDS_POINTS.match(cell) for cell in cells)
    what = (
        f"{path}: column(s) {names} look like numbers written with a decimal comma, which are "
        "read as text (the decimal mark must be a point: '1.5', not '1,5')"
    )
    if kind != "csv":
        raise ValueError(
            f"{what}; store them as numbers (e.g. with pandas: "
            "df[col] = df[col].str.replace(',', '.').astype(float)) and load the file again"
        )
    delimiter = _csv_delimiter(path)
    source = repr(str(path)) + ("" if delimiter == "," else f", sep={delimiter!r}")
    others = [
        c
        for c in columns
        if c.numeric and c.name not in found and np.any(c.values != np.round(c.values))
    ]
    if others:  # other columns with a decimal point: decimal=',' would misread them
        cols = list(found)
        fix = (
            f"df = pd.read_csv({source}, dtype=str); df[{cols!r}] = df[{cols!r}]"
            + (".apply(lambda c: c.str.replace('.', ''))" if thousands else "")
            + ".apply(lambda c: c.str.replace(',', '.')).astype(float); "
            "df.to_csv('fixed.csv', index=False)"
        )
    else:
        fix = (
            f"pd.read_csv({source}, decimal=','"
            + (", thousands='.'" if thousands else "")
            + ").to_csv('fixed.csv', index=False)"
        )
    # in a ',' file a quoted "12,345" may be twelve thousand: English thousands separators
    ambiguous = delimiter == "," and all(re.fullmatch(r"[+-]?\d{1,3},\d{3}", c) for c in cells)
    raise ValueError(
        f"{what}. Rewrite the file with decimal points and load that file: save it from the "
        f"spreadsheet with '.' as the decimal separator, or with pandas: {fix}"
        + (
            ". If ',' separates the thousands there ('12,345' for 12345), remove it instead"
            if ambiguous
            else ""
        )
    )


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
        As for :func:`pyro_sgmcmc.data.datasets.load_dataset`.

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
        message lists the columns), missing values (the columns and rows), columns of numbers
        written with a decimal comma (``1,5``; the message says how to rewrite the file),
        non-numeric feature columns, non-finite numbers, a target with a single class, a
        non-numeric regression target, non-integer class labels, or too few rows to split.
    ImportError
        For a Parquet file when ``pandas`` or ``pyarrow`` is missing.
    """
    path = Path(path)
    kind = _check_table_arguments(path, target, task)
    seed, test_fraction, max_train, max_test = _check_split_arguments(
        seed, test_fraction, max_train, max_test
    )
    columns = _read_columns(path, kind)
    target_column, features = _split_target(path, kind, columns, target)
    _check_decimal_commas(path, kind, columns, target, task)
    _check_values(path, kind, columns, features, target_column)
    task, task_source = _resolve_task(target, target_column, task)
    x = np.column_stack([c.values for c in features])
    y, class_names = _encode_target(target, target_column, task)
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
            + _single_row_classes(y, class_names, task)
        )
    if max_train is None and max_test is None:
        _warn_if_the_split_drifts(path, dataset, test_fraction, y)
    metadata = {**dataset.metadata, "target": target, "task_source": task_source}
    return replace(dataset, metadata=metadata)


def _warn_if_the_split_drifts(
    path: Path, dataset: Dataset, test_fraction: float, y: np.ndarray
) -> None:
    """Warn where a stratified split's test share is far from ``test_fraction``: every class of
    two or more rows keeps a test row, so many small classes (a numeric target read as classes)
    hold out far more than asked."""
    if dataset.task != "classification":
        return
    share = dataset.num_test / (dataset.num_train + dataset.num_test)
    if abs(share - test_fraction) <= SPLIT_DRIFT:
        return
    _, counts = np.unique(y, return_counts=True)
    small = int((counts * test_fraction < 1).sum())
    warnings.warn(
        f"{path}: the stratified split holds out {share:.0%} of the rows, not the "
        f"test_fraction {test_fraction:.0%}: {small} of the {len(counts)} classes have too few "
        f"rows for it, and each class of two or more rows keeps a test row; is the target a "
        "number to regress (task='regression', --task regression)?",
        UserWarning,
        stacklevel=3,
    )


def _single_row_classes(y: np.ndarray, class_names: Any, task: str) -> str:
    """For a classification split that failed: which classes have one row (the stratified
    split keeps such a class in training, so a table of them leaves no test rows)."""
    if task != "classification":
        return ""
    labels, counts = np.unique(y, return_counts=True)
    single = labels[counts == 1]
    if not len(single):
        return ""
    names = [str(class_names[i]) if class_names else str(i) for i in single[:5]]
    more = ", ..." if len(single) > 5 else ""
    return (
        f". {len(single)} of the {len(labels)} classes have a single row (e.g. "
        f"{', '.join(repr(n) for n in names)}{more}), which the stratified split keeps in "
        "training: is the target column an identifier rather than a class? Give the class "
        "column as --target (or task='regression' for a numeric target)"
    )


def _check_table_arguments(path: Path, target: Any, task: Any) -> str:
    """The table's format (a value of :data:`TABLE_FORMATS`), once the file, ``target`` and
    ``task`` are checked."""
    kind = TABLE_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"data file {str(path)!r}: unknown suffix {path.suffix!r}; allowed suffixes are "
            f"{', '.join(TABLE_FORMATS)}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    _check_task(task)
    if not isinstance(target, str) or not target:
        raise ValueError(f"target must name a column of {path}, got {target!r}")
    return kind


def _read_columns(path: Path, kind: str) -> list[_Column]:
    """The table's columns, read by the reader of its format; names unique, lengths equal."""
    reader = {"csv": _read_csv, "npz": _read_npz, "parquet": _read_parquet}[kind]
    columns = reader(path)
    names = [c.name for c in columns]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: column names repeat: {', '.join(map(repr, duplicates))}")
    lengths = {len(c.values) for c in columns}
    if len(lengths) > 1:
        raise ValueError(f"{path}: the arrays have different lengths {sorted(lengths)}")
    return columns


def _split_target(
    path: Path, kind: str, columns: list[_Column], target: str
) -> tuple[_Column, list[_Column]]:
    """The target column and the feature columns (all the others); the table must have rows."""
    names = [c.name for c in columns]
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
    return target_column, features


def _check_values(
    path: Path,
    kind: str,
    columns: list[_Column],
    features: list[_Column],
    target_column: _Column,
) -> None:
    """No missing values anywhere, numeric features, and finite numbers."""
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


def _resolve_task(target: str, target_column: _Column, task: Task | None) -> tuple[Task, str]:
    """The task (given, or inferred from the target column) and the rule that decided it."""
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
    return task, task_source


def _encode_target(
    target: str, target_column: _Column, task: Task
) -> tuple[np.ndarray, tuple[str, ...]]:
    """The targets (class labels ``0..K-1`` in sorted order of the values, or the regression
    values) and the class names (empty for regression)."""
    y_raw = target_column.values
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
        if len(y) and bool(np.all(y == y[0])):
            raise ValueError(
                f"target column {target!r} holds one value ({_label(y[0])!r}) on every row: "
                "there is nothing to regress"
            )
    return y, class_names


def _label(value: Any) -> str:
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)
