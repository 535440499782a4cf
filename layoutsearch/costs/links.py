"""Bytes/s of each transfer a layout makes: its tensor-parallel collectives, its gradient
reduction, a context-parallel ring hop and a pipeline hop.

Which links a group runs over follows from the ranks' placement alone: Megatron-LM numbers
ranks tp fastest, then cp, dp and pp, and fills nodes of gpus_per_node consecutive ranks. A
group stays on NVLink where its ranks share a node; across nodes NCCL runs one ring per
NIC, so a group with r ranks on each node moves its inter-node traffic over r NICs at once.
The links inside a layer (tensor-parallel collectives, the context-parallel ring) are
worked out per layer shape; the gradient reduction once per distinct (tp, cp, dp) sizes, a
few hundred in a million-row table (`distinct.per_distinct`).

    layer_links(shapes.layer, constants).tensor_parallel  # bytes/s of the tp all-reduces
    step_links(shapes, constants).gradient                # bytes/s of the gradient reduction
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from layoutsearch.costs.distinct import per_distinct
from layoutsearch.costs.shapes import Array, LayerShape, Shapes


class Fabric(NamedTuple):
    """Per row (or one number for every row): the cluster's links and how well NCCL uses
    them (the cost model's `nvlink_efficiency` and `network_efficiency`)."""

    gpus_per_node: Array
    num_gpus: Array
    intra_node_bandwidth: Array
    """NVLink bytes/s per GPU."""
    inter_node_bandwidth: Array
    """Network bytes/s per GPU (one NIC)."""
    nvlink_efficiency: Array
    network_efficiency: Array

    @classmethod
    def of(cls, layer: LayerShape, k: Mapping[str, Array]) -> Fabric:
        return cls(layer.gpus_per_node, layer.num_gpus, layer.intra_node_bandwidth,
                   layer.inter_node_bandwidth, k["nvlink_efficiency"], k["network_efficiency"])


@dataclass(frozen=True, slots=True)
class LayerLinks:
    """Bytes/s of the transfers inside one layer, per row (or one number for every row)."""

    tensor_parallel: Array
    """Bus bandwidth of the tp ranks' collectives (adjacent ranks)."""
    context_ring: Array
    """A context-parallel ring hop: one send to the next of the cp ranks, tp apart."""


@dataclass(frozen=True, slots=True)
class StepLinks:
    """Bytes/s of the transfers between stages and between steps, per row (or one number
    for every row: a pipeline hop depends on the job alone)."""

    gradient: Array
    """Bus bandwidth of the gradient reduction over the dp·cp ranks, tp apart."""
    pipeline_hop: Array
    """A send between neighbouring pipeline stages."""


def layer_links(layer: LayerShape, k: Mapping[str, Array]) -> LayerLinks:
    fabric = Fabric.of(layer, k)
    one = np.ones_like(layer.tp)
    # Context parallelism passes K and V around a ring of point-to-point sends (Transformer
    # Engine's AttnFuncWithCPAndKVP2P: send_dst = cp_global_ranks[(rank + 1) % cp_size]):
    # where the ring leaves a node, that hop runs over the sending GPU's one NIC however
    # many CP ranks share the node, and it paces every step.
    ring = link_bandwidth(fabric, stays_in_node(layer.cp, layer.tp, fabric.gpus_per_node,
                                                fabric.num_gpus), one)
    return LayerLinks(bus_bandwidth(fabric, layer.tp, one), ring)


def step_links(sh: Shapes, k: Mapping[str, Array]) -> StepLinks:
    fabric = Fabric.of(sh.layer, k)
    # A pipeline over more than one node has a hop across a node boundary (stages are
    # blocks of tp·cp·dp consecutive ranks), which paces it: one rank each side, one NIC.
    hop = link_bandwidth(fabric, fabric.num_gpus <= fabric.gpus_per_node,
                         np.ones_like(fabric.num_gpus))
    # A few hundred distinct (tp, dp, cp) sizes among a million rows.
    gradient, = per_distinct(_gradient_bandwidth, sh.layer.tp, sh.dp, sh.layer.cp, *fabric)
    return StepLinks(gradient, hop)


def gradient_ranks(dp: Array, cp: Array) -> Array:
    """Ranks that reduce the gradients together: Megatron reduces over the data- and
    context-parallel ranks together (its dp-cp group), dp·cp ranks, tp apart."""
    return dp * cp


def _gradient_bandwidth(tp: Array, dp: Array, cp: Array, *fabric_columns: Array,
                        ) -> tuple[Array]:
    return bus_bandwidth(Fabric(*fabric_columns), gradient_ranks(dp, cp), tp),


def link_bandwidth(fabric: Fabric, inside_nodes: Array, ranks_per_node: Array) -> Array:
    """Bytes/s of a transfer: NVLink's where it stays `inside_nodes`; else NCCL runs one
    ring per NIC, so a group with r ranks on each node moves its inter-node traffic over r
    NICs at once (r × the per-GPU NIC rate, at most NVLink's)."""
    network = np.minimum(ranks_per_node * fabric.inter_node_bandwidth,
                         fabric.intra_node_bandwidth)
    return np.where(inside_nodes, fabric.intra_node_bandwidth * fabric.nvlink_efficiency,
                    network * fabric.network_efficiency)


def _whole(numbers: Any) -> Any:
    """Rank counts, held as floats by `Shapes`, as integers: their gcds and quotients are
    exact either way, and ~5x faster on integers."""
    return np.asarray(numbers).astype(np.int64)


def stays_in_node(size: Any, stride: Any, gpus_per_node: Any, num_gpus: Any) -> Any:
    """Whether the groups of `size` ranks `stride` apart stay inside nodes: their blocks of
    size·stride consecutive ranks tile whole nodes (or the job has one node). A block
    tiles nodes when it divides gpus_per_node: when it is gcd(gpus_per_node, block)."""
    block = _whole(size * stride)
    return (num_gpus <= gpus_per_node) | (np.gcd(_whole(gpus_per_node), block) == block)


def bus_bandwidth(fabric: Fabric, size: Array, stride: Array) -> Array:
    """NCCL bus bandwidth, bytes/s, of the groups of `size` ranks `stride` ranks apart.

    Such groups tile blocks of size·stride consecutive ranks from rank 0: they stay inside
    nodes when the blocks do (or the job has one node). A block that straddles a node
    boundary (tp 4 on 6-GPU nodes) puts a group across it, and the slowest group paces
    the step: the one with the fewest ranks on a node. Node boundaries fall on multiples of
    gpus_per_node, so the smallest part of a block they cut is gcd(gpus_per_node, block)
    ranks, holding gcd / stride of its group's ranks (at least one); a block of whole nodes
    has gpus_per_node / stride on each.
    """
    block = size * stride
    nodes = fabric.gpus_per_node
    inside = stays_in_node(size, stride, nodes, fabric.num_gpus)
    cut = np.gcd(_whole(nodes), _whole(block))
    ranks_per_node = np.clip(cut // np.maximum(_whole(stride), 1), 1, size)
    return link_bandwidth(fabric, inside, ranks_per_node)
