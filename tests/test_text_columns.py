import numpy as np
import pandas as pd

from layoutsearch.text_columns import coded_text, first_text, plain_text, text_column


def test_a_text_column_gathers_its_texts_as_plain_text() -> None:
    column = text_column(np.array([1, 0, 1]), ["", "vp (2) > 1 needs pp > 1"],
                         pd.Index([7, 8, 9]))
    expected = pd.Series(["vp (2) > 1 needs pp > 1", "", "vp (2) > 1 needs pp > 1"],
                         index=[7, 8, 9], dtype=object).astype(str)
    pd.testing.assert_series_equal(column, expected)


def test_a_categorical_column_reads_as_astype_str_makes_it() -> None:
    column = pd.Series(pd.Categorical(["flash2", "torch", "flash2"]), index=[3, 1, 2])
    pd.testing.assert_series_equal(plain_text(column), column.astype(str))
    missing = pd.Series(pd.Categorical(["flash2", None]))
    pd.testing.assert_series_equal(plain_text(missing), missing.astype(str))


def test_repeated_texts_share_one_category() -> None:
    coded = coded_text(np.array([0, 1, 2, 0]), ["", "a", "a"])
    assert list(coded.categories) == ["", "a"]
    assert list(coded) == ["", "a", "a", ""]


def test_the_first_text_said_wins_and_missing_reads_as_empty() -> None:
    rules = pd.Series(pd.Categorical(["vp (2) > 1 needs pp > 1", "", ""]))
    costs = pd.Series(["needs 91.2 GiB > 80.0 GiB per GPU", "needs 90.0 GiB > 80.0 GiB per GPU",
                       None], dtype=object)
    assert first_text(rules, costs).tolist() == [
        "vp (2) > 1 needs pp > 1", "needs 90.0 GiB > 80.0 GiB per GPU", ""]


def test_no_rows_make_the_columns_pandas_makes_of_no_strings() -> None:
    # A search or a score of no rows: reasons stay an object column, as an empty array of
    # strings gives; categorical text follows astype(str).
    empty = text_column(np.array([], dtype=np.intp), [""], pd.RangeIndex(0))
    pd.testing.assert_series_equal(empty, pd.Series(np.array([], dtype=object)))
    no_kernels = pd.Series(pd.Categorical([], categories=["flash2"]))
    pd.testing.assert_series_equal(plain_text(no_kernels), no_kernels.astype(str))
