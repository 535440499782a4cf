"""Parameter counts and FLOPs per token against hand-computed and published numbers."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.errors import LayoutSearchError
from layoutsearch.specs import Job, ModelSpec


def test_llama_13b_parameters_by_hand() -> None:
    h, f, layers, vocab = 5120, 13824, 40, 32000
    attention = 4 * h * h                # Q, K, V, O: 104,857,600
    mlp = 3 * h * f                      # SwiGLU gate, up, down: 212,336,640
    norms = 2 * h                        # two RMSNorm weights
    per_layer = attention + mlp + norms  # 317,204,480
    embeddings = 2 * vocab * h           # untied input and output: 327,680,000
    total = layers * per_layer + embeddings + h  # + final RMSNorm
    assert per_layer == 317_204_480
    assert total == 13_015_864_320
    model = load_model("llama_13b")
    assert model.layer_parameters() == per_layer
    assert model.num_parameters() == total


def test_llama_13b_with_the_study_vocabulary_is_14b() -> None:
    # Hagemann et al. used a ~128k vocabulary: 2·(128000 − 32000)·5120 more parameters.
    bigger = load_model("llama_13b", vocab_size=128000).num_parameters()
    assert bigger == 13_015_864_320 + 2 * 96_000 * 5120 == 13_998_904_320
    assert round(bigger / 1e9, 1) == 14.0


def test_llama3_8b_parameters_by_hand() -> None:
    h, f, layers, vocab, groups, head_dim = 4096, 14336, 32, 128256, 8, 128
    attention = 2 * h * h + 2 * h * groups * head_dim  # GQA: K and V are h x 1024
    per_layer = attention + 3 * h * f + 2 * h          # 218,112,000
    total = layers * per_layer + 2 * vocab * h + h
    assert total == 8_030_261_248
    assert load_model("llama3_8b").num_parameters() == total


def test_gpt3_175b_parameters_by_hand() -> None:
    h, f, layers, vocab, positions = 12288, 49152, 96, 50257, 2048
    weights = 4 * h * h + 2 * h * f      # attention + GELU MLP (two matrices of h x 4h)
    biases = 3 * h + h + f + h           # QKV, attention output, MLP up, MLP down
    norms = 2 * 2 * h                    # two LayerNorms with weight and bias
    total = layers * (weights + biases + norms) + vocab * h + positions * h + 2 * h
    assert total == 174_604_259_328      # "175B"; tied embeddings counted once
    assert load_model("gpt3_175b").num_parameters() == total


def test_paper_flops_per_token() -> None:
    model = load_model("llama_13b")
    n, s = 13_015_864_320, 2048
    assert model.paper_flops_per_token(s) == 6 * n + 12 * 40 * 5120 * s


def _tiny(**fields: object) -> ModelSpec:
    base: dict[str, object] = dict(name="tiny", num_layers=2, hidden_size=64,
                                   ffn_hidden_size=160, num_attention_heads=4,
                                   num_query_groups=2, vocab_size=1000)
    return ModelSpec(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize("swiglu", [True, False])
def test_megatron_flops_match_a_per_matmul_count(swiglu: bool) -> None:
    model = _tiny(swiglu=swiglu)
    h, f, layers, vocab, s, head_dim, groups = 64, 160, 2, 1000, 128, 16, 2
    # Forward FLOPs per token: 2 per weight of each matmul, plus QK^T and AV (2·s·h each).
    projections = 2 * (h * h + 2 * h * groups * head_dim + h * h)  # Q, K, V, O
    mlp = 2 * (3 if swiglu else 2) * h * f
    scores = 2 * 2 * s * h
    logits = 2 * h * vocab
    # Training = forward + backward (2x forward) = 3x forward.
    full = 3 * (layers * (projections + mlp + scores) + logits)
    halved = 3 * (layers * (projections + mlp + scores / 2) + logits)
    assert model.megatron_flops_per_token(s, causal_halving=False) == pytest.approx(full)
    assert model.megatron_flops_per_token(s, causal_halving=True) == pytest.approx(halved)
    # Causal halving changes only the attention-score term: 3·L·2·s·h.
    difference = full - halved
    assert difference == 3 * layers * 2 * s * h


def test_model_rejects_bad_shapes() -> None:
    with pytest.raises(LayoutSearchError, match=r"hidden_size \(65\).*num_attention_heads \(4\)"):
        _tiny(hidden_size=65)
    groups = r"num_attention_heads \(4\) must divide by num_query_groups \(3\)"
    with pytest.raises(LayoutSearchError, match=groups):
        _tiny(num_query_groups=3)
    with pytest.raises(LayoutSearchError, match=r"num_layers=0: must be a positive integer"):
        _tiny(num_layers=0)
    with pytest.raises(LayoutSearchError, match=r"rotary_base=1000000.0: must be a positive"):
        _tiny(rotary_base=1e6)
    with pytest.raises(LayoutSearchError,
                       match=r"rope_scaling_factor=0: must be a finite positive"):
        _tiny(rope_scaling_factor=0)
    with pytest.raises(LayoutSearchError, match=r"rope_scaling_factor=8.0: scales RoPE, but "
                       r"position_embedding_type is 'learned_absolute'"):
        _tiny(rope_scaling_factor=8.0, position_embedding_type="learned_absolute")
    with pytest.raises(LayoutSearchError, match=r"rotary_base=500000: is RoPE's base, but "
                       r"position_embedding_type is 'learned_absolute'"):
        _tiny(rotary_base=500000, position_embedding_type="learned_absolute")
    with pytest.raises(LayoutSearchError, match=r"normalization='BatchNorm'"):
        _tiny(normalization="BatchNorm")


@pytest.mark.parametrize(("field", "value"), [("swiglu", "no"), ("untie_embeddings", 3),
                                              ("add_bias_linear", "false")])
def test_model_flags_must_be_booleans(field: str, value: object) -> None:
    # "no" and "false" are truthy strings: taken as they are they would mean True.
    with pytest.raises(LayoutSearchError, match=rf"\.{field}={value!r}: must be true or false"):
        _tiny(**{field: value})


def test_replace_validates_and_names_unknown_fields() -> None:
    model = _tiny()
    assert model.replace(vocab_size=2000).vocab_size == 2000
    with pytest.raises(LayoutSearchError, match=r"no field 'vocab'.*vocab_size"):
        model.replace(vocab=2000)
    with pytest.raises(LayoutSearchError, match=r"^model 'tiny'\.vocab_size=-1: must be a "
                                                r"positive integer"):
        model.replace(vocab_size=-1)


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_gpus", 0), ("num_gpus", -8), ("num_gpus", 8.5), ("seq_length", 0),
     ("global_batch_size", "2048"), ("global_batch_size", True)],
)
def test_job_rejects_non_positive_integers(field: str, value: object) -> None:
    sizes: dict[str, object] = {"num_gpus": 8, "seq_length": 2048, "global_batch_size": 64}
    sizes[field] = value
    rule = rf"^{field}={value!r}: must be a positive integer"
    with pytest.raises(LayoutSearchError, match=rule):
        Job(model=_tiny(), cluster=load_cluster("a100_80gb"), **sizes)  # type: ignore[arg-type]


def test_job_accepts_numpy_integers() -> None:
    job = Job(model=_tiny(), cluster=load_cluster("a100_80gb"), num_gpus=np.int64(16),
              seq_length=np.int32(2048), global_batch_size=64)
    assert job.tokens_per_step == 2048 * 64


def test_job_needs_whole_nodes() -> None:
    rule = r"^num_gpus=12: must be a whole number of nodes of 8 GPUs.*try 8 or 16"
    with pytest.raises(LayoutSearchError, match=rule):
        Job(model=_tiny(), cluster=load_cluster("a100_80gb"), num_gpus=12, seq_length=2048,
            global_batch_size=64)
    # Part of one node is fine.
    Job(model=_tiny(), cluster=load_cluster("a100_80gb"), num_gpus=4, seq_length=2048,
        global_batch_size=64)


def test_learned_positions_bound_the_sequence_length() -> None:
    learned = _tiny(position_embedding_type="learned_absolute", max_position_embeddings=1024)
    rule = (r"^seq_length=2048: exceeds model\.max_position_embeddings=1024.*"
            r"use seq_length <= 1024")
    with pytest.raises(LayoutSearchError, match=rule):
        Job(model=learned, cluster=load_cluster("a100_80gb"), num_gpus=8, seq_length=2048,
            global_batch_size=64)
    Job(model=learned, cluster=load_cluster("a100_80gb"), num_gpus=8, seq_length=1024,
        global_batch_size=64)
    # Rotary embeddings have no table: the field does not bound them.
    Job(model=_tiny(max_position_embeddings=1024), cluster=load_cluster("a100_80gb"),
        num_gpus=8, seq_length=4096, global_batch_size=64)


def test_unset_command_fields_stay_out_of_the_job_columns() -> None:
    # A candidate table (and an optuna study's fingerprint) of a model without RoPE scaling
    # has no rope_scaling_factor column; Llama 3.1 405B's has its factor.
    cluster = load_cluster("h100_sxm")
    plain = Job(model=load_model("llama3_8b"), cluster=cluster, num_gpus=8, seq_length=8192,
                global_batch_size=64).columns()
    assert "rope_scaling_factor" not in plain and plain["rotary_base"] == 500000
    scaled = Job(model=load_model("llama3_405b"), cluster=cluster, num_gpus=1024,
                 seq_length=8192, global_batch_size=1024).columns()
    assert scaled["rope_scaling_factor"] == 8.0


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("supports_flash3", "no", "must be true or false"),  # a truthy string
    ("supports_flash3", 1, "must be true or false"),
    ("peak_tflops", math.inf, "must be a finite positive number"),  # every MFU 0
    ("memory_gib", float("1e400"), "must be a finite positive number"),  # every layout fits
    ("compute_capability", "8.0", r"must be \[major, minor\], two integers"),
    ("compute_capability", [9], r"must be \[major, minor\], two integers"),
    ("compute_capability", [9, True], r"must be \[major, minor\], two integers"),
])
def test_gpu_fields_name_the_field_value_and_rule(field: str, value: object, rule: str) -> None:
    gpu = load_cluster("a100_80gb").gpu
    with pytest.raises(LayoutSearchError, match=f"gpu 'a100_80gb'.{field}=.*: {rule}"):
        dataclasses.replace(gpu, **{field: value})


def test_a_gpus_compute_capability_is_kept_as_a_pair_of_integers() -> None:
    # As YAML gives it; a tuple keys the checkout's checks (megatron/checkout_check.py).
    gpu = dataclasses.replace(load_cluster("a100_80gb").gpu, compute_capability=[8, 6])
    assert gpu.compute_capability == (8, 6)
    assert load_cluster("h200").gpu.compute_capability == (9, 0)


@pytest.mark.parametrize("spec", ["model", "gpu", "cluster"])
@pytest.mark.parametrize("name", [None, 123, "", "  "])
def test_a_spec_is_named_by_a_non_empty_string(spec: str, name: object) -> None:
    # None got through as "job: None"; a number failed inside a sort of the GPU names.
    cluster = load_cluster("a100_80gb")
    specs = {"model": load_model("llama_13b"), "gpu": cluster.gpu, "cluster": cluster}
    with pytest.raises(LayoutSearchError, match=rf"{spec}\.name={name!r}: must be a non-empty "
                                                "string"):
        dataclasses.replace(specs[spec], name=name)


def test_a_cluster_needs_a_gpu_spec_not_its_name() -> None:
    # The string was accepted and failed in the search, on a missing attribute.
    with pytest.raises(LayoutSearchError, match=r"cluster 'a100_80gb'\.gpu='h100_sxm': must be "
                                                r"a GPUSpec; .*load_cluster\('a100_80gb'\)\.gpu"):
        load_cluster("a100_80gb", gpu="h100_sxm")


@pytest.mark.parametrize(("field", "value", "hint"), [
    ("model", "llama_13b", r"load_model\('llama_13b'\)"),
    ("cluster", "a100_80gb", r"load_cluster\('a100_80gb'\)"),
])
def test_a_job_needs_specs_not_names(field: str, value: str, hint: str) -> None:
    parts: dict[str, Any] = {"model": _tiny(), "cluster": load_cluster("a100_80gb")}
    parts[field] = value
    with pytest.raises(LayoutSearchError, match=rf"^{field}='{value}': must be a .*{hint}"):
        Job(**parts, num_gpus=8, seq_length=2048, global_batch_size=64)
