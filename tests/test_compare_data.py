"""Your own data: ``pyro_sgmcmc.data.datasets.load_table`` on CSV, NPZ and Parquet files.

The tables are written by the tests; the checks are on what a user relies on: the split and the
standardisation match the built-in sets, the task is inferred as documented, and every bad table
gets an error that names the problem (the column, the rows, the allowed values).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from pyro_sgmcmc.data import datasets_table
from pyro_sgmcmc.data.datasets import MAX_INFERRED_CLASSES, load_table


def write_csv(path, header, rows, delimiter=","):
    lines = [delimiter.join(header)] + [delimiter.join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def regression_rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-2.0, 2.0, n)
    x2 = rng.normal(3.0, 2.0, n)
    y = 5.0 + 2.0 * x1 - x2 + 0.1 * rng.normal(size=n)
    return [(a, b, c) for a, b, c in zip(x1, x2, y, strict=True)]


def test_csv_regression_is_split_and_standardised_like_the_built_in_sets(tmp_path):
    rows = regression_rows()
    path = write_csv(tmp_path / "houses.csv", ["x1", "x2", "price"], rows)
    data = load_table(path, "price", seed=3, test_fraction=0.25)
    assert data.name == "houses" and data.task == "regression"
    assert data.feature_names == ("x1", "x2") and data.num_features == 2
    assert (data.num_train, data.num_test) == (30, 10)
    assert data.x_train.dtype == torch.float32 and data.y_train.shape == (30,)
    # training statistics: mean 0 and sd 1 on the training rows, kept for the way back
    assert torch.allclose(data.x_train.mean(0), torch.zeros(2), atol=1e-5)
    assert torch.allclose(data.x_train.std(0, unbiased=False), torch.ones(2), atol=1e-5)
    assert abs(float(data.y_train.mean())) < 1e-5
    original = np.array(rows)
    back = data.y_to_original(torch.cat([data.y_train, data.y_test])).numpy()
    assert np.allclose(np.sort(back), np.sort(original[:, 2]), atol=1e-4)
    assert data.metadata["task_source"] == "inferred: numeric target"
    again = load_table(path, "price", seed=3, test_fraction=0.25)
    assert torch.equal(again.x_test, data.x_test)
    other = load_table(path, "price", seed=4, test_fraction=0.25)
    assert not torch.equal(other.x_test, data.x_test)


def test_text_labels_are_classes_in_sorted_order_with_a_stratified_split(tmp_path):
    labels = ["cat"] * 12 + ["dog"] * 8 + ["emu"] * 20
    rows = [(i, (i * 7) % 5, label) for i, label in enumerate(labels)]
    path = write_csv(tmp_path / "pets.csv", ["a", "b", "kind"], rows, delimiter=";")
    data = load_table(path, "kind", test_fraction=0.25)
    assert data.task == "classification" and data.num_classes == 3
    assert data.class_names == ("cat", "dog", "emu")
    assert data.y_train.dtype == torch.int64
    counts = torch.bincount(data.y_test, minlength=3).tolist()
    assert counts == [3, 2, 5]  # a quarter of each class
    assert data.metadata["task_source"] == "inferred: text target"


def test_integer_targets_are_classes_up_to_the_documented_limit(tmp_path):
    few = [(i, i % 3 + 1) for i in range(30)]
    data = load_table(write_csv(tmp_path / "few.csv", ["x", "grade"], few), "grade")
    assert data.task == "classification" and data.class_names == ("1", "2", "3")
    many = [(i, i) for i in range(MAX_INFERRED_CLASSES + 5)]
    data = load_table(write_csv(tmp_path / "many.csv", ["x", "count"], many), "count")
    assert data.task == "regression"
    forced = load_table(tmp_path / "few.csv", "grade", task="regression")
    assert forced.task == "regression" and forced.metadata["task_source"] == "given"


def test_npz_arrays_become_columns(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "arrays.npz"
    np.savez(path, x=rng.normal(size=(25, 3)), extra=rng.normal(size=25), y=rng.normal(size=25))
    data = load_table(path, "y")
    assert data.feature_names == ("x[0]", "x[1]", "x[2]", "extra")
    assert data.task == "regression" and data.num_train + data.num_test == 25
    labels = np.array(["no", "yes"] * 10)
    np.savez(path, x=rng.normal(size=(20, 2)), answer=labels)
    assert load_table(path, "answer").class_names == ("no", "yes")


@pytest.mark.skipif(
    importlib.util.find_spec("pyarrow") is None, reason="Parquet needs pyarrow (not installed)"
)
def test_parquet_table(tmp_path):
    import pandas as pd

    frame = pd.DataFrame(regression_rows(), columns=["x1", "x2", "y"])
    frame["label"] = np.where(frame["x1"] > 0, "up", "down")
    path = tmp_path / "table.parquet"
    frame.drop(columns="y").to_parquet(path)
    data = load_table(path, "label")
    assert data.task == "classification" and data.class_names == ("down", "up")
    frame.loc[3, "x2"] = None
    frame.to_parquet(path)
    with pytest.raises(ValueError, match=r"missing values, column 'x2': 1 \(row 3\)"):
        load_table(path, "y")


def test_parquet_without_its_packages_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "table.parquet"
    path.write_bytes(b"PAR1")
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "pyarrow" else real_find_spec(name, *args)

    monkeypatch.setattr(datasets_table.importlib.util, "find_spec", find_spec)
    with pytest.raises(ImportError, match=r"needs the optional package.*pyarrow.*pip install"):
        load_table(path, "y")


@pytest.mark.parametrize(
    ("header", "rows", "target", "kwargs", "error", "message"),
    [
        (
            ["a", "b", "y"],
            [(1, 2, 3), (4, "", 6), (7, 8, "NA"), (1, 1, 1)],
            "y",
            {},
            ValueError,
            r"missing values, column 'b': 1 \(line 3\); column 'y': 1 \(line 4\)",
        ),
        (
            ["colour", "b", "y"],
            [("red", 1, 2.5), ("blue", 2, 3.5), ("red", 3, 1.5), ("red", 4, 0.5)],
            "y",
            {},
            ValueError,
            r"feature column\(s\) 'colour' \(e.g. 'red'\) are not numeric",
        ),
        (
            ["a", "y"],
            [(1, "same"), (2, "same"), (3, "same"), (4, "same")],
            "y",
            {},
            ValueError,
            r"target column 'y' has a single class \('same'\); classification needs at least two",
        ),
        (
            ["a", "y"],
            [(1, 2.0), (2, 3.0), (3, 4.0)],
            "price",
            {},
            ValueError,
            r"target column 'price' is not in .*t.csv; its columns are: a, y",
        ),
        (
            ["a", "y"],
            [(1, "x"), (2, "z"), (3, "x"), (4, "z")],
            "y",
            {"task": "regression"},
            ValueError,
            r"target column 'y' is not numeric \(e.g. 'x'\) and cannot be a regression target",
        ),
        (
            ["a", "y"],
            [(1, 0.5), (2, 1.0), (3, 1.5), (4, 2.0)],
            "y",
            {"task": "classification"},
            ValueError,
            r"target column 'y' has non-integer values \(e.g. 0.5\)",
        ),
        (
            ["a", "y"],
            [(1, 0.5), (2, 1.0), (3, 1.5)],
            "y",
            {"task": "ordinal"},
            ValueError,
            r"task must be None, 'regression' or 'classification', got 'ordinal'",
        ),
        (
            ["a", "y"],
            [(1, 0.5), (2, 1.0), (3, "inf")],
            "y",
            {},
            ValueError,
            r"column 'y' holds infinite values \(line 4\)",
        ),
        (
            ["y"],
            [(1,), (2,), (3,)],
            "y",
            {},
            ValueError,
            r"has no feature column besides the target 'y'",
        ),
        (
            ["a", "a", "y"],
            [(1, 2, 3), (2, 3, 4), (3, 4, 5)],
            "y",
            {},
            ValueError,
            r"column names repeat: 'a'",
        ),
    ],
)
def test_bad_tables_get_errors_naming_the_problem(
    tmp_path, header, rows, target, kwargs, error, message
):
    path = write_csv(tmp_path / "t.csv", header, rows)
    with pytest.raises(error, match=message):
        load_table(path, target, **kwargs)


def test_bad_files_get_errors_naming_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data file '.*nowhere\.csv' does not exist"):
        load_table(tmp_path / "nowhere.csv", "y")
    (tmp_path / "t.xlsx").write_text("")
    with pytest.raises(ValueError, match=r"unknown suffix '.xlsx'; allowed suffixes are .csv"):
        load_table(tmp_path / "t.xlsx", "y")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="is empty: expected a header line"):
        load_table(tmp_path / "empty.csv", "y")
    (tmp_path / "ragged.csv").write_text("a,b,y\n1,2,3\n4,5\n")
    with pytest.raises(ValueError, match="row 3 has 2 fields but the header has 3") as error:
        load_table(tmp_path / "ragged.csv", "y")
    assert "decimal comma" not in str(error.value)
    # unquoted decimal commas in a ',' CSV split numbers into two fields: named as the cause
    (tmp_path / "split.csv").write_text("a,b,y\n1,2,3\n4,-3,25,7\n")
    hint = r"If the file writes numbers with a decimal comma \(is '-3,25' one number\?\), .* ';'"
    with pytest.raises(ValueError, match=rf"row 3 has 4 fields but the header has 3 .*{hint}"):
        load_table(tmp_path / "split.csv", "y")
    # not for a trailing comma, nor where too few pairs of cells could be split numbers
    ragged = [("trailing", "a,b,y\n1,2,3\n4,5,6,\n"), ("words", "a,b,y\n1,2,3\nu,v,w,x\n")]
    for name, text in ragged:
        (tmp_path / f"{name}.csv").write_text(text)
        with pytest.raises(ValueError, match="row 3 has 4 fields but the header") as error:
            load_table(tmp_path / f"{name}.csv", "y")
        assert "decimal comma" not in str(error.value)
    (tmp_path / "tiny.csv").write_text("a,y\n1,2\n2,3\n")
    with pytest.raises(ValueError, match="has 2 rows; at least 3 are needed"):
        load_table(tmp_path / "tiny.csv", "y")
    np.savez(tmp_path / "cube.npz", x=np.zeros((4, 2, 2)), y=np.zeros(4))
    with pytest.raises(ValueError, match=r"array 'x' has shape \(4, 2, 2\)"):
        load_table(tmp_path / "cube.npz", "y")


def _decimal_comma(value):
    return f"{value:.3f}".replace(".", ",")


def test_numbers_with_a_decimal_comma_are_named_with_the_fix(tmp_path):
    """A table written with decimal commas (a European ';' CSV, or a quoted "1,5" in a ',' CSV)
    is named as such, not taken for categories or for an identifier column, and the pandas line
    the message gives writes a file that loads."""
    import pandas as pd

    rows = regression_rows()
    european = tmp_path / "european.csv"
    write_csv(european, ["x1", "x2", "price"], [map(_decimal_comma, r) for r in rows], ";")
    comma = r"look like numbers written with a decimal comma, which are read as text"
    with pytest.raises(ValueError, match=r"column\(s\) 'x1' \(e.g. '-?\d+,\d{3}'\), 'x2' .*"):
        load_table(european, "price")
    with pytest.raises(ValueError, match=rf"'price' \(e.g. .*\) {comma}.*sep=';', decimal=','"):
        load_table(european, "price", task="regression")
    quoted = tmp_path / "quoted.csv"
    cells = [(f'"{_decimal_comma(a)}"', f"{b:.3f}", f"{c:.3f}") for a, b, c in rows]
    write_csv(quoted, ["x1", "x2", "price"], cells)
    with pytest.raises(ValueError, match=rf"column\(s\) 'x1' \(e.g. .*\) {comma}") as error:
        load_table(quoted, "price")
    assert "categor" not in str(error.value)
    assert "If ',' separates the thousands there ('12,345' for 12345)" in str(error.value)
    target_only = tmp_path / "target.csv"
    cells = [(f"{a:.3f}", f"{b:.3f}", f'"{_decimal_comma(c)}"') for a, b, c in rows]
    write_csv(target_only, ["x1", "x2", "price"], cells)
    with pytest.raises(ValueError, match=rf"column\(s\) 'price' .*{comma}") as target_error:
        load_table(target_only, "price")  # was: 40 classes of a single row, an identifier?
    for path, message in [(european, None), (quoted, error), (target_only, target_error)]:
        if message is None:
            with pytest.raises(ValueError) as message:
                load_table(path, "price")
        fix = str(message.value).split("with pandas: ", 1)[1].split(". If ',' separates", 1)[0]
        fixed = tmp_path / f"fixed_{path.name}"
        exec(fix.replace("'fixed.csv'", repr(str(fixed))), {"pd": pd})
        data = load_table(fixed, "price", seed=3, test_fraction=0.25)
        assert data.task == "regression" and data.feature_names == ("x1", "x2")
        targets = torch.cat([data.y_to_original(data.y_train), data.y_to_original(data.y_test)])
        prices = np.sort([round(r[2], 3) for r in rows])
        np.testing.assert_allclose(np.sort(targets.numpy()), prices, atol=1e-4)
