"""A formula worked out once per distinct combination of its inputs (or per distinct layer
shape) equals it on every row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs import build_cost_model, distinct
from layoutsearch.costs.constants import load_constants
from layoutsearch.costs.distinct import groups, per_distinct
from layoutsearch.costs.memory import layer_activation_bytes
from layoutsearch.costs.shapes import LayerShape, Shapes, _uniform
from layoutsearch.costs.timing import layer_seconds
from tests.costs.builders import table


@pytest.fixture(autouse=True)
def _small_tables_keyed_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests' tables are small; they look for combinations as big tables do."""
    monkeypatch.setattr(distinct, "MIN_ROWS", 0)


def _formula(tp: np.ndarray, pp: np.ndarray, scale: np.ndarray,
             ) -> tuple[np.ndarray, np.ndarray]:
    """An element-wise formula with a (3, rows) output and a per-row one."""
    stages = np.stack([tp / 3.0, pp * scale, np.sqrt(tp + pp) / 7.0])
    return stages, stages.max(axis=0)


def _columns(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.choice([1.0, 2.0, 4.0, 8.0], rows), rng.choice([1.0, 3.0, 16.0], rows))


def _same_bits(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> bool:
    return all(np.shape(g) == np.shape(w) and np.asarray(g).tobytes() == np.asarray(w).tobytes()
               for g, w in zip(got, want, strict=True))


def _combinations(*columns: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct combinations of `columns`, column by column, and per row the index of
    its own (`groups`)."""
    found = groups(list(columns))
    assert found is not None
    first, inverse = found
    return [column[first] for column in columns], inverse


def test_whole_number_columns_give_each_combination_once_and_every_row_its_own() -> None:
    tp, pp = _columns(1000)
    flags = tp > 2
    (tps, pps, flagged), inverse = _combinations(tp, pp, flags)
    assert len(tps) == 12  # 4 tp x 3 pp; the flag follows tp
    assert np.array_equal(tps[inverse], tp) and np.array_equal(pps[inverse], pp)
    assert np.array_equal(flagged[inverse], flags)
    assert len(set(zip(tps.tolist(), pps.tolist(), strict=True))) == len(tps)


@pytest.mark.parametrize("odd", [
    pytest.param(np.array([0.5, 1.0]), id="fraction"),
    pytest.param(np.array([-2.0, 1.0]), id="negative"),
    pytest.param(np.array([np.nan, 1.0]), id="nan"),
    pytest.param(np.array([float(2**40), 1.0]), id="beyond-whole-limit"),
])
def test_other_columns_are_told_apart_by_hashing(odd: np.ndarray) -> None:
    values = np.tile(odd, 50)
    tp, _ = _columns(100)
    (found, tps), inverse = _combinations(values, tp)
    # repr: NaN is one value here, as it is to the formulas' inputs.
    assert len(found) == len({(repr(v), t) for v, t in zip(values.tolist(), tp.tolist(),
                                                            strict=True)})
    np.testing.assert_array_equal(found[inverse], values)  # NaN rows read back as NaN
    np.testing.assert_array_equal(tps[inverse], tp)


def test_many_possible_keys_are_hashed_not_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three columns of values up to 2**19 allow ~2**57 keys: too many to mark a flag each.
    rng = np.random.default_rng(1)
    columns = tuple(rng.choice([1.0, 2.0**19 - 1], 200) for _ in range(3))
    monkeypatch.setattr(distinct, "DENSE_LIMIT", 16)
    found, inverse = _combinations(*columns)
    assert len(found[0]) == 8
    for values, column in zip(found, columns, strict=True):
        np.testing.assert_array_equal(values[inverse], column)


@pytest.mark.parametrize("scale", [pytest.param(np.asarray(1.5), id="one-number"),
                                   pytest.param(None, id="per-row")])
def test_per_distinct_equals_the_formula_on_every_row_bit_for_bit(scale: np.ndarray | None,
                                                                   ) -> None:
    tp, pp = _columns(5000, seed=2)
    per_row = np.where(tp > 2, 0.1, 0.3) if scale is None else scale
    got = per_distinct(_formula, tp, pp, per_row)
    assert got[0].shape == (3, 5000)
    assert _same_bits(got, _formula(tp, pp, per_row))


def test_per_distinct_of_rows_that_never_repeat_or_of_no_rows_calls_the_formula_once() -> None:
    calls: list[int] = []

    def counted(tp: np.ndarray, pp: np.ndarray, scale: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray]:
        calls.append(len(tp))
        return _formula(tp, pp, scale)

    tp, pp = np.array([1.0, 2.0, 4.0]), np.array([1.0, 1.0, 1.0])
    assert _same_bits(per_distinct(counted, tp, pp, np.asarray(2.0)),
                      _formula(tp, pp, np.asarray(2.0)))
    empty = np.array([], dtype=float)
    assert per_distinct(counted, empty, empty, np.asarray(2.0))[0].shape == (3, 0)
    assert calls == [3, 0]


def test_groups_give_a_row_of_each_combination_and_every_row_its_own() -> None:
    tp, pp = _columns(1000, seed=5)
    found = groups([tp, pp])
    assert found is not None
    first, inverse = found
    assert len(first) == 12  # 4 tp x 3 pp
    np.testing.assert_array_equal(tp[first][inverse], tp)
    np.testing.assert_array_equal(pp[first][inverse], pp)


def test_no_groups_without_columns_or_where_no_row_repeats(monkeypatch: pytest.MonkeyPatch,
                                                          ) -> None:
    assert groups([]) is None
    assert groups([np.array([1.0, 2.0, 4.0])]) is None
    monkeypatch.setattr(distinct, "MIN_ROWS", 100)
    assert groups(list(_columns(99))) is None
    assert groups(list(_columns(100))) is not None


def test_a_layers_figures_per_distinct_layer_shape_are_every_rows_bit_for_bit() -> None:
    # 144 rows, 24 layer shapes (tp x micro-batch x attention x recompute): pp and the
    # distributed optimizer split the model and the step, not a layer.
    rows = table(num_gpus=64, tp=[1, 2, 4], pp=[1, 2, 4], micro_batch_size=[1, 2],
                 attention=["fused", "flash2"], recompute=["none", "full"],
                 distributed_optimizer=[False, True])
    sh = Shapes.of(rows, clusters_by_gpu())
    assert sh.layer_groups is not None and len(sh.layer_groups[0]) == 24
    assert len(rows) == 144
    k = {name: np.asarray(value) for name, value in
         load_constants("analytic")["a100_80gb"].to_dict().items()}
    keyed, every_row = sh.per_layer(layer_seconds, k), layer_seconds(sh.layer, k)
    assert list(keyed) == list(every_row)
    for name, value in every_row.items():
        assert keyed[name].tobytes() == value.tobytes(), name
    memory = sh.per_layer(layer_activation_bytes)
    for name, value in layer_activation_bytes(sh.layer).items():
        assert memory[name].tobytes() == value.tobytes(), name


def test_constants_that_differ_by_row_price_every_layer_row_by_row() -> None:
    sh = Shapes.of(table(num_gpus=64, tp=[1, 2], pp=[1, 2, 4]), clusters_by_gpu())
    assert sh.layer_groups is not None
    seen: list[int] = []

    def formula(layer: LayerShape, k: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(len(layer.tp))
        return {"scaled": layer.tp * k["scale"]}

    per_row = sh.per_layer(formula, {"scale": np.arange(6.0)})
    shared = sh.per_layer(formula, {"scale": np.asarray(3.0)})
    assert seen == [6, 2]
    np.testing.assert_array_equal(per_row["scaled"], sh.layer.tp * np.arange(6.0))
    np.testing.assert_array_equal(shared["scaled"], sh.layer.tp * 3.0)


def test_a_table_under_min_rows_is_worked_out_row_by_row(monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    monkeypatch.setattr(distinct, "MIN_ROWS", 100)
    calls: list[int] = []

    def counted(tp: np.ndarray, pp: np.ndarray, scale: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray]:
        calls.append(len(tp))
        return _formula(tp, pp, scale)

    for rows in (99, 100):
        tp, pp = _columns(rows, seed=rows)
        assert _same_bits(per_distinct(counted, tp, pp, np.asarray(2.0)),
                          _formula(tp, pp, np.asarray(2.0)))
    assert calls[0] == 99 and calls[1] == 12  # 4 tp x 3 pp among the 100 rows


def test_whole_number_columns_whose_key_would_pass_int64_are_hashed() -> None:
    # Five columns of values up to 2**19 allow ~2**95 keys: a mixed-radix int64 key of their
    # values wraps, and the combinations read back from it would be wrong.
    rng = np.random.default_rng(3)
    columns = tuple(rng.choice([1.0, 2.0**19 - 1], 200) for _ in range(5))
    found, inverse = _combinations(*columns)
    assert len(found[0]) == 32
    for values, column in zip(found, columns, strict=True):
        np.testing.assert_array_equal(values[inverse], column)


def test_a_table_of_jobs_whose_layout_key_would_pass_int64_is_scored_row_by_row() -> None:
    # Two jobs of one width, their layer counts, vocabularies and batches apart: the whole
    # inputs of the pipeline's shapes (layers, vocabulary, batch, tp, pp, dp, vp, micro-batch
    # size) allow ~1.5e19 combinations, past int64. Each row scores as it does alone.
    big = table(num_gpus=16384, global_batch_size=16384, tp=[1, 8], pp=[1, 2, 4],
                micro_batch_size=[1, 4], recompute=["none", "full"],
                model_fields=dict(num_layers=40, vocab_size=1_000_000))
    small = table(num_gpus=64, global_batch_size=512, tp=[1, 2], pp=[1, 2, 4],
                  recompute=["none", "full"], model_fields=dict(num_layers=127, vocab_size=32000))
    model, clusters = build_cost_model("analytic"), clusters_by_gpu()
    together = model.score(pd.concat([big, small], ignore_index=True), clusters)
    apart = pd.concat([model.score(big, clusters), model.score(small, clusters)],
                      ignore_index=True)
    pd.testing.assert_frame_equal(together, apart, check_exact=True)


@pytest.mark.parametrize("other", [pytest.param(np.array([1.0, 2.0]), id="whole"),
                                   pytest.param(np.array([0.5, 2.0]), id="hashed")])
def test_negative_zero_is_told_apart_from_zero(other: np.ndarray) -> None:
    # -0.0 == 0.0, but 1 / -0.0 is -inf: each row's formula sees its own zero's sign.
    zeros = np.tile([0.0, -0.0, 0.0], 20)
    rest = np.tile(other, 30)
    (found, _), inverse = _combinations(zeros, rest)
    assert found[inverse].tobytes() == zeros.tobytes()
    with np.errstate(divide="ignore"):
        assert _same_bits(per_distinct(lambda z, r: (r / z,), zeros, rest), (rest / zeros,))


def test_a_column_is_one_number_only_where_its_rows_hold_the_same_bits() -> None:
    assert _uniform(np.array([2.0, 2.0])).ndim == 0
    assert _uniform(np.array([True, True])).ndim == 0
    mixed_zeros = np.array([0.0, -0.0])
    assert _uniform(mixed_zeros) is mixed_zeros
