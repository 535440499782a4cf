"""Suggestions for mistyped names: what a user most likely meant, or nothing."""

from __future__ import annotations

import pytest

from layoutsearch.errors import closest_names, unknown_name_message

CLUSTERS = ["a100_40gb", "a100_80gb", "h100_sxm", "h200"]
MODELS = ["llama_13b", "llama_65b", "llama2_13b", "llama2_70b", "llama3_8b", "llama3_70b"]


@pytest.mark.parametrize("name, valid, expected", [
    ("h100", CLUSTERS, ["h100_sxm"]),              # cut short, not the nearer 'h200'
    ("a100", CLUSTERS, ["a100_40gb", "a100_80gb"]),  # two equally likely
    ("LLAMA_13B", MODELS, ["llama_13b"]),           # case ignored
    ("llama13b", MODELS, ["llama_13b"]),
    ("v100", CLUSTERS, []),                         # nothing close: no guess
    ("h200_sxm", CLUSTERS, ["h200"]),               # a suffix added, not the nearer 'h100_sxm'
    ("llama_70b", MODELS, ["llama2_70b", "llama3_70b"]),  # two equally close, by similarity
])
def test_closest_names(name, valid, expected):
    assert closest_names(name, valid) == expected


def test_message_offers_every_equally_close_name():
    message = unknown_name_message("cluster", "a100", CLUSTERS)
    assert message.startswith("unknown cluster 'a100'; did you mean one of 'a100_40gb', "
                              "'a100_80gb'? valid cluster names: a100_40gb, a100_80gb, ")
    assert "did you mean" not in unknown_name_message("cluster", "v100", CLUSTERS)
