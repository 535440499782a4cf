"""The built-in catalog: every entry loads, names are checked, fields can be overridden."""

from __future__ import annotations

import re
from typing import Any

import pytest

from layoutsearch.catalog import (
    cluster_from_dict,
    cluster_names,
    clusters_by_gpu,
    load_cluster,
    load_model,
    model_from_dict,
    model_names,
)
from layoutsearch.errors import LayoutSearchError


def test_every_catalog_entry_loads() -> None:
    assert {"llama_13b", "llama_30b", "llama_65b", "llama3_8b", "gpt3_175b"} <= set(model_names())
    assert {"a100_80gb", "h100_sxm"} <= set(cluster_names())
    for name in model_names():
        assert load_model(name).name == name
    for name in cluster_names():
        assert load_cluster(name).name == name


def test_published_dimensions() -> None:
    llama30 = load_model("llama_30b")
    assert (llama30.num_layers, llama30.hidden_size, llama30.num_attention_heads) == (60, 6656, 52)
    assert load_model("llama3_8b").query_groups == 8
    a100 = load_cluster("a100_80gb")
    assert (a100.gpu.peak_tflops, a100.gpu.memory_gib, a100.gpus_per_node) == (312, 80, 8)
    assert load_cluster("h100_sxm").gpu.supports_flash3
    assert not a100.gpu.supports_flash3
    assert clusters_by_gpu()["a100_80gb"] == a100


@pytest.mark.parametrize(("cluster", "mib"), [
    ("a100_40gb", 40536), ("a100_80gb", 81920), ("h100_sxm", 81559), ("h200", 143771)])
def test_gpu_memory_is_what_the_driver_reports(cluster: str, mib: int) -> None:
    # nvidia-smi's total per GPU, MiB (the catalog rounds to 0.1 GiB), not the datasheet GB.
    assert load_cluster(cluster).gpu.memory_gib == pytest.approx(mib / 1024, abs=0.05)


def test_unknown_names_list_valid_names_and_the_closest() -> None:
    with pytest.raises(LayoutSearchError) as error:
        load_model("llama13b")
    message = str(error.value)
    assert "unknown model 'llama13b'; did you mean 'llama_13b'?" in message
    assert "llama3_8b" in message and "gpt3_175b" in message
    with pytest.raises(LayoutSearchError, match=r"unknown cluster 'a100'; did you mean one "
                                                r"of 'a100_40gb', 'a100_80gb'\?"):
        load_cluster("a100")
    with pytest.raises(LayoutSearchError, match=r"unknown cluster 'tpu'; valid cluster names: "):
        load_cluster("tpu")


@pytest.mark.parametrize("load", [load_model, load_cluster])
@pytest.mark.parametrize("name", [None, 13, "../model/llama_13b"])
def test_a_catalog_name_must_be_one_of_the_names(load: Any, name: object) -> None:
    # None failed inside the name matcher; a path read another folder's file.
    with pytest.raises(LayoutSearchError, match=r"valid (model|cluster) names: "):
        load(name)


def test_a_catalog_entry_can_be_renamed() -> None:
    assert load_model("llama_13b", name="llama_13b_128k").name == "llama_13b_128k"
    assert load_cluster("h100_sxm", name="eos").name == "eos"


def test_overrides_change_fields_and_are_validated() -> None:
    assert load_model("llama_13b", vocab_size=128000).vocab_size == 128000
    assert load_model("llama_13b").vocab_size == 32000  # the cached YAML is not mutated
    with pytest.raises(LayoutSearchError, match=r"no field 'vocab'"):
        load_model("llama_13b", vocab="x")
    assert load_cluster("a100_80gb", gpus_per_node=4).gpus_per_node == 4


def test_definitions_from_dicts_name_their_mistakes() -> None:
    with pytest.raises(LayoutSearchError,
                       match=r"model 'm': unknown model field 'layers'; did you mean 'num_layers'"):
        model_from_dict({"name": "m", "layers": 2})
    with pytest.raises(LayoutSearchError, match=re.escape(
            "model 'm': missing field(s) hidden_size, ffn_hidden_size, num_attention_heads, "
            "vocab_size; a model needs name, num_layers, hidden_size, ffn_hidden_size, "
            "num_attention_heads, vocab_size")):
        model_from_dict({"name": "m", "num_layers": 2})
    with pytest.raises(LayoutSearchError, match=r"^model definition: missing field\(s\) name, "):
        model_from_dict({})  # an empty YAML file
    for build, kind in ((model_from_dict, "model"), (cluster_from_dict, "cluster")):
        with pytest.raises(LayoutSearchError, match=rf"{kind} definition \['num_layers'\]: "
                                                    "must be a mapping of field names"):
            build(["num_layers"])  # a YAML file written as a list
    with pytest.raises(LayoutSearchError, match=r"^cluster 'c': missing field\(s\) gpu; "):
        cluster_from_dict({"name": "c", "intra_node_bandwidth_gbps": 1,
                           "inter_node_bandwidth_gbps": 1})
    # A catalog name where the GPU's figures belong: the value is named, not dropped.
    with pytest.raises(LayoutSearchError, match=re.escape(
            "cluster 'c'.gpu='a100_80gb': must be a mapping of the GPU's fields (name, "
            "peak_tflops, memory_gib, memory_bandwidth_gbps, supports_flash3, "
            "compute_capability); copy the gpu block of a catalog cluster")):
        cluster_from_dict({"name": "c", "gpu": "a100_80gb", "intra_node_bandwidth_gbps": 1,
                           "inter_node_bandwidth_gbps": 1})
    with pytest.raises(LayoutSearchError, match=r"^gpu 'g'\.peak_tflops=0: must be a finite "
                                                r"positive number"):
        cluster_from_dict({"name": "c", "intra_node_bandwidth_gbps": 1,
                           "inter_node_bandwidth_gbps": 1,
                           "gpu": {"name": "g", "peak_tflops": 0, "memory_gib": 1,
                                   "memory_bandwidth_gbps": 1}})


def test_cluster_override_of_an_unknown_field_is_named() -> None:
    with pytest.raises(LayoutSearchError, match=r"cluster has no field 'gpus'.*gpus_per_node"):
        load_cluster("a100_80gb", gpus=4)
    with pytest.raises(LayoutSearchError, match=r"^cluster 'a100_80gb'\.gpus_per_node=0: must "
                                                r"be a positive integer"):
        load_cluster("a100_80gb", gpus_per_node=0)
