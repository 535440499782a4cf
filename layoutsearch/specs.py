"""What is trained (`ModelSpec`), where (`ClusterSpec`), and the job that ties them (`Job`).

Specs are frozen, keyword-only dataclasses validated on construction, so a bad size is
reported once, by field name, before any search starts.

    model = ModelSpec(name="tiny", num_layers=2, hidden_size=256, ffn_hidden_size=688,
                      num_attention_heads=4, vocab_size=32000)
    model.num_parameters()  # exact count, embeddings included
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from layoutsearch.errors import LayoutSearchError

NORMALIZATIONS = ("RMSNorm", "LayerNorm")
POSITION_EMBEDDINGS = ("rope", "learned_absolute")
ROTARY_BASE = 10000
"""RoPE's base θ unless a model says otherwise (Su et al. 2021; Megatron-LM's default)."""
COMMAND_FIELDS = ("add_bias_linear", "position_embedding_type", "max_position_embeddings",
                  "rotary_base", "rope_scaling_factor")
"""ModelSpec fields outside the measurement schema that change the Megatron-LM command: they
ride along in candidate tables so that a command built from a row trains the same model."""


LARGEST_SIZE = 2**53
"""The largest size a spec or a measurement may hold: every integer up to it is exact as a
float (a CSV cell such as 1e+20 reads as one), and the int64 columns of candidate tables hold
it without wrapping around (num_gpus=10**30 would overflow them deep inside a search)."""


def _key(owner: str, name: str) -> str:
    """How a message names a field: `model.hidden_size`; one of the job's bare (JOB_OWNER)."""
    return f"{owner}.{name}" if owner else name


JOB_OWNER = ""
"""The owner of the job's fields in messages: none (`num_gpus=0`, not `job.num_gpus=0`,
which neither the command nor `search()` accepts)."""


def _require_positive_int(owner: str, name: str, value: Any) -> None:
    # numbers.Integral also admits numpy integers, e.g. a value taken from a DataFrame.
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or not 0 < int(value) <= LARGEST_SIZE):
        raise LayoutSearchError(
            f"{_key(owner, name)}={value!r}: must be a positive integer of at most 2**53"
        )


def _require_name(kind: str, value: Any) -> None:
    # The name labels reports and measurement files and keys clusters by GPU kind: None or
    # a number would fail later, inside a sort or a lookup, with no word of which field.
    if not isinstance(value, str) or not value.strip():
        raise LayoutSearchError(f"{kind}.name={value!r}: must be a non-empty string")


def _require_spec(owner: str, name: str, value: Any, cls: type, hint: str) -> None:
    # A catalog name where a spec belongs ('a100_80gb' for a GPUSpec) has none of its
    # fields; say how to get the spec rather than fail on a missing attribute later.
    if not isinstance(value, cls):
        raise LayoutSearchError(
            f"{_key(owner, name)}={value!r}: must be a {cls.__name__}; {hint}")


def _require_bool(owner: str, name: str, value: Any) -> None:
    # A string such as "no" is truthy: take only real booleans (numpy's too).
    if not isinstance(value, bool | np.bool_):
        raise LayoutSearchError(f"{_key(owner, name)}={value!r}: must be true or false")


def _require_positive_number(owner: str, name: str, value: Any) -> None:
    # `inf` passes `> 0` and prices every layout at MFU 0 or lets every layout fit.
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not 0 < float(value) < math.inf):
        raise LayoutSearchError(f"{_key(owner, name)}={value!r}: must be a finite positive number")


def _compute_capability(owner: str, value: Any) -> tuple[int, int]:
    if (isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2
            or not all(isinstance(part, numbers.Integral) and not isinstance(part, bool)
                       and 0 <= int(part) < 100 for part in value)):
        raise LayoutSearchError(
            f"{_key(owner, 'compute_capability')}={value!r}: must be [major, minor], two "
            "integers as torch.cuda.get_device_capability() gives them (A100: [8, 0])")
    return int(value[0]), int(value[1])


Spec = TypeVar("Spec", "ModelSpec", "ClusterSpec")


def _replace(spec: Spec, kind: str, changes: dict[str, Any]) -> Spec:
    valid = {f.name for f in dataclasses.fields(spec)}
    for key in changes:
        if key not in valid:
            raise LayoutSearchError(
                f"{kind} has no field {key!r}; fields: {', '.join(sorted(valid))}"
            )
    return dataclasses.replace(spec, **changes)


Count = TypeVar("Count", float, np.ndarray)


def paper_flops_per_token(num_parameters: Count, num_layers: Count, hidden_size: Count,
                          seq_length: Count) -> Count:
    """Model FLOPs per trained token, forward and backward: 6N + 12·L·h·s, of one model
    (numbers) or of every row of a table (arrays).

    Hagemann et al. 2023 after PaLM (Chowdhery et al. 2022, appendix B); this is the
    numerator of the study's MFU. Recomputation is not counted (that would be HFU).
    """
    return 6.0 * num_parameters + 12.0 * num_layers * hidden_size * seq_length


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, in Megatron-LM's argument names."""

    name: str
    """A label for reports and measurement files (free text, e.g. `llama_13b`)."""
    num_layers: int
    """Transformer blocks L."""
    hidden_size: int
    """Model width h."""
    ffn_hidden_size: int
    """Inner width of the MLP."""
    num_attention_heads: int
    """Query heads a; `hidden_size` must divide by it."""
    num_query_groups: int | None = None
    """Key/value heads for grouped-query attention; None means one per query head."""
    vocab_size: int
    """Vocabulary size V (before Megatron pads it to a multiple of 128·tp)."""
    swiglu: bool = True
    """Gated MLP with three weight matrices (LLaMA) instead of two (GPT)."""
    untie_embeddings: bool = True
    """Separate input embedding and output projection matrices."""
    normalization: str = "RMSNorm"
    """`RMSNorm` (LLaMA) or `LayerNorm` (GPT); the fused RMSNorm kernel needs RMSNorm."""
    add_bias_linear: bool = False
    """Biases on the linear layers (GPT-3 has them, LLaMA does not)."""
    position_embedding_type: str = "rope"
    """`rope` (no parameters) or `learned_absolute` (a max_position_embeddings × h table)."""
    max_position_embeddings: int = 2048
    """Rows of the learned position table; unused with rope, whose commands pass
    max(seq_length, this) because Megatron-LM's validate_args asks for at least seq_length."""
    rotary_base: int = ROTARY_BASE
    """RoPE base θ (Su et al. 2021: 10,000; Llama 3 trains with 500,000); Megatron-LM's
    `--rotary-base`. It changes no FLOP or byte, but a command with the wrong base trains
    another model."""
    rope_scaling_factor: float | None = None
    """Llama 3.1's RoPE frequency scaling (Dubey et al. 2024, §3.1.1 and the released
    `rope_scaling` config: factor 8), Megatron-LM's `--use-rope-scaling --rope-scaling-factor`;
    None for plain RoPE. Like the base, it changes no FLOP or byte."""

    def __post_init__(self) -> None:
        _require_name("model", self.name)
        owner = f"model {self.name!r}"
        for name in ("num_layers", "hidden_size", "ffn_hidden_size",
                     "num_attention_heads", "vocab_size", "max_position_embeddings",
                     "rotary_base"):
            _require_positive_int(owner, name, getattr(self, name))
        if self.num_query_groups is not None:
            _require_positive_int(owner, "num_query_groups", self.num_query_groups)
        if self.rope_scaling_factor is not None:
            _require_positive_number(owner, "rope_scaling_factor", self.rope_scaling_factor)
            if self.position_embedding_type != "rope":
                raise LayoutSearchError(
                    f"{owner}.rope_scaling_factor={self.rope_scaling_factor!r}: scales RoPE, "
                    f"but position_embedding_type is {self.position_embedding_type!r}; set it "
                    "to null or use rope")
        if self.rotary_base != ROTARY_BASE and self.position_embedding_type != "rope":
            raise LayoutSearchError(
                f"{owner}.rotary_base={self.rotary_base!r}: is RoPE's base, but "
                f"position_embedding_type is {self.position_embedding_type!r}, whose commands "
                f"pass no --rotary-base; leave it at {ROTARY_BASE} or use rope")
        for name in ("swiglu", "untie_embeddings", "add_bias_linear"):
            _require_bool(owner, name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise LayoutSearchError(
                f"{owner}: hidden_size ({self.hidden_size}) must divide by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.query_groups:
            raise LayoutSearchError(
                f"{owner}: num_attention_heads ({self.num_attention_heads}) must divide "
                f"by num_query_groups ({self.query_groups})"
            )
        if self.normalization not in NORMALIZATIONS:
            raise LayoutSearchError(
                f"{owner}.normalization={self.normalization!r}: must be one of "
                f"{', '.join(NORMALIZATIONS)}"
            )
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise LayoutSearchError(
                f"{owner}.position_embedding_type={self.position_embedding_type!r}: "
                f"must be one of {', '.join(POSITION_EMBEDDINGS)}"
            )

    @property
    def query_groups(self) -> int:
        """Key/value heads (equal to the query heads without GQA)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def layer_parameters(self) -> int:
        """Parameters of one transformer block."""
        h, f = self.hidden_size, self.ffn_hidden_size
        kv = 2 * h * self.query_groups * self.head_dim  # K and V projections
        attention = 2 * h * h + kv  # Q and output projections are h x h
        mlp = (3 if self.swiglu else 2) * h * f
        norm_weights = 2 * h if self.normalization == "RMSNorm" else 4 * h
        biases = 0
        if self.add_bias_linear:
            biases = (h + 2 * self.query_groups * self.head_dim) + h
            biases += (2 if self.swiglu else 1) * f + h
        return attention + mlp + norm_weights + biases

    def embedding_parameters(self) -> int:
        """Input embedding, output projection when untied, learned positions."""
        h, v = self.hidden_size, self.vocab_size
        count = v * h * (2 if self.untie_embeddings else 1)
        if self.position_embedding_type == "learned_absolute":
            count += self.max_position_embeddings * h
        return count

    def num_parameters(self) -> int:
        """All parameters, embeddings included (the study's N)."""
        final_norm = self.hidden_size * (1 if self.normalization == "RMSNorm" else 2)
        return self.num_layers * self.layer_parameters() + self.embedding_parameters() + final_norm

    def paper_flops_per_token(self, seq_length: int) -> float:
        """Model FLOPs per trained token, forward and backward: 6N + 12·L·h·s (the module's
        `paper_flops_per_token`)."""
        return paper_flops_per_token(self.num_parameters(), self.num_layers, self.hidden_size,
                                     seq_length)

    def megatron_flops_per_token(self, seq_length: int, *, causal_halving: bool = True) -> float:
        """Megatron-LM's `num_floating_point_operations` divided by the tokens of the batch.

        Per matmul, GQA- and SwiGLU-aware, logits included. Megatron core ≥ 0.12 halves the
        causal attention term (`causal_halving=True`); older Megatron and NeMo do not.
        Biases, norms and embeddings lookups are not counted.
        """
        h, a = self.hidden_size, self.num_attention_heads
        query_ratio = a * self.head_dim / h
        attention_scores = seq_length / h * (0.5 if causal_halving else 1.0)
        attention = (1 + self.query_groups / a + attention_scores) * query_ratio
        mlp = self.ffn_hidden_size / h * (1.5 if self.swiglu else 1.0)
        # 12 = 3 GEMMs per weight (forward, wgrad, dgrad) x 2 matrices of that size x 2 FLOPs.
        blocks = 12.0 * self.num_layers * h * h * (attention + mlp)
        logits = 6.0 * h * self.vocab_size
        return blocks + logits

    def replace(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed, validated like a new spec."""
        return _replace(self, "model", changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One accelerator kind, from its datasheet."""

    name: str
    """Catalog name, also the `gpu` column of measurement files (e.g. `a100_80gb`)."""
    peak_tflops: float
    """Dense bf16 matrix peak, TFLOP/s (A100: 312; H100/H200 SXM: 989)."""
    memory_gib: float
    """Device memory as the driver reports it, GiB (A100 80GB: 81920 MiB = 80 GiB)."""
    memory_bandwidth_gbps: float
    """HBM bandwidth, GB/s (A100 80GB: 2039)."""
    supports_flash3: bool = False
    """FlashAttention 3 needs Hopper (sm90) instructions."""
    compute_capability: tuple[int, int] | None = None
    """CUDA compute capability, (major, minor) as torch.cuda reports it (A100 (8, 0), H100
    and H200 (9, 0)): what Megatron-LM's validate_args asks of the GPU, which the checkout's
    own check answers with on a machine without one (megatron/checkout_check.py). None:
    not known, and such a check of a tp or cp > 1 command needs the GPU itself."""

    def __post_init__(self) -> None:
        _require_name("gpu", self.name)
        owner = f"gpu {self.name!r}"
        for name in ("peak_tflops", "memory_gib", "memory_bandwidth_gbps"):
            _require_positive_number(owner, name, getattr(self, name))
        _require_bool(owner, "supports_flash3", self.supports_flash3)
        if self.compute_capability is not None:
            # YAML gives a list; a frozen spec keeps a tuple (hashable, as the key of a check).
            object.__setattr__(self, "compute_capability",
                               _compute_capability(owner, self.compute_capability))


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """Nodes of identical GPUs: a GPU kind plus the links between GPUs."""

    name: str
    """Catalog name (e.g. `a100_80gb`)."""
    gpu: GPUSpec
    gpus_per_node: int = 8
    """GPUs that share one NVLink/NVSwitch domain."""
    intra_node_bandwidth_gbps: float
    """NVLink bandwidth per GPU and direction, GB/s (A100: 300; H100: 450)."""
    inter_node_bandwidth_gbps: float
    """Network bandwidth per GPU and direction, GB/s (one 200 Gb/s HDR NIC per GPU: 25)."""

    def __post_init__(self) -> None:
        _require_name("cluster", self.name)
        owner = f"cluster {self.name!r}"
        _require_spec(owner, "gpu", self.gpu, GPUSpec,
                      "take one from the catalog, load_cluster('a100_80gb').gpu, or build "
                      "GPUSpec(name=..., peak_tflops=..., memory_gib=..., "
                      "memory_bandwidth_gbps=...)")
        _require_positive_int(owner, "gpus_per_node", self.gpus_per_node)
        for name in ("intra_node_bandwidth_gbps", "inter_node_bandwidth_gbps"):
            _require_positive_number(owner, name, getattr(self, name))

    def replace(self, **changes: Any) -> ClusterSpec:
        """A copy with some fields changed, validated like a new spec."""
        return _replace(self, "cluster", changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One training run to plan: a model on some GPUs of a cluster with a fixed batch."""

    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    """World size."""
    seq_length: int
    """Tokens per sequence s."""
    global_batch_size: int
    """Sequences per optimizer step."""

    def __post_init__(self) -> None:
        _require_spec(JOB_OWNER, "model", self.model, ModelSpec,
                      "load one from the catalog, load_model('llama_13b')")
        _require_spec(JOB_OWNER, "cluster", self.cluster, ClusterSpec,
                      "load one from the catalog, load_cluster('a100_80gb')")
        for name in ("num_gpus", "seq_length", "global_batch_size"):
            _require_positive_int(JOB_OWNER, name, getattr(self, name))
        per_node = self.cluster.gpus_per_node
        if self.num_gpus > per_node and self.num_gpus % per_node:
            nodes = self.num_gpus // per_node
            raise LayoutSearchError(
                f"num_gpus={self.num_gpus}: must be a whole number of nodes of "
                f"{per_node} GPUs (cluster.gpus_per_node); try {nodes * per_node} or "
                f"{(nodes + 1) * per_node}"
            )
        # A learned position table has max_position_embeddings rows: longer sequences have no
        # position to look up (Megatron-LM's validate_args asserts max_position_embeddings >=
        # seq_length). Rotary embeddings have no table, so any length runs.
        m = self.model
        if m.position_embedding_type == "learned_absolute" and (
                self.seq_length > m.max_position_embeddings):
            raise LayoutSearchError(
                f"seq_length={self.seq_length}: exceeds model.max_position_embeddings="
                f"{m.max_position_embeddings}, the rows of {m.name}'s learned position table; "
                f"use seq_length <= {m.max_position_embeddings} or raise "
                "model.max_position_embeddings"
            )

    @property
    def tokens_per_step(self) -> int:
        return self.seq_length * self.global_batch_size

    def to_record(self) -> dict[str, Any]:
        """The job as plain JSON values, as a frame's `attrs` must hold it:
        DataFrame.to_parquet writes `attrs` as JSON (pandas >= 2.1)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Job:
        """The job `to_record` wrote (also read back from a Parquet file's `attrs`)."""
        cluster = dict(record["cluster"])
        return cls(model=ModelSpec(**record["model"]),
                   cluster=ClusterSpec(**{**cluster, "gpu": GPUSpec(**cluster["gpu"])}),
                   num_gpus=record["num_gpus"], seq_length=record["seq_length"],
                   global_batch_size=record["global_batch_size"])

    def columns(self) -> dict[str, Any]:
        """The job as measurement-schema columns (docs/measurements.md), one value each,
        then the model fields the schema leaves out but a launch command needs (COMMAND_FIELDS)."""
        m = self.model
        return {
            "model": m.name,
            "num_layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "ffn_hidden_size": m.ffn_hidden_size,
            "num_attention_heads": m.num_attention_heads,
            "num_query_groups": m.query_groups,
            "vocab_size": m.vocab_size,
            "seq_length": self.seq_length,
            "swiglu": m.swiglu,
            "untie_embeddings": m.untie_embeddings,
            "normalization": m.normalization,
            "gpu": self.cluster.gpu.name,
            "num_gpus": self.num_gpus,
            "gpus_per_node": self.cluster.gpus_per_node,
            "global_batch_size": self.global_batch_size,
            # Unset (None) fields stay out: tables and optuna studies of models without them
            # keep the columns (and fingerprints) they had before the field existed.
            **{name: getattr(m, name) for name in COMMAND_FIELDS if getattr(m, name) is not None},
        }

