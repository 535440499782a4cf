"""Bandwidths of a layout's groups: placement of ranks on nodes, inside a layer and between
layers and steps."""

from __future__ import annotations

import numpy as np
import pandas as pd

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs.constants import load_constants
from layoutsearch.costs.links import (
    Fabric,
    bus_bandwidth,
    layer_links,
    stays_in_node,
    step_links,
)
from layoutsearch.costs.shapes import Shapes
from tests.costs.builders import table


def _constants(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """The prior's constants per row, by the row's GPU kind."""
    prior = load_constants("analytic")
    per_kind = [prior[gpu].to_dict() for gpu in rows["gpu"]]
    return {name: np.array([c[name] for c in per_kind]) for name in per_kind[0]}


def test_a_straddling_group_gets_the_nics_of_its_fewest_ranks_on_a_node() -> None:
    # 6-GPU nodes, 24 GPUs. tp 4: ranks 4-7 put 2 on node 0 and 2 on node 1 (2 NICs).
    # dp 4 at tp 2 (stride 2, blocks of 8 ranks): node 1 starts at rank 6, so the groups
    # 0, 2, 4, 6 and 1, 3, 5, 7 each have one rank there (1 NIC).
    rows = table(num_gpus=24, global_batch_size=24, tp=[4, 2]).assign(gpus_per_node=6)
    sh, k = Shapes.of(rows, clusters_by_gpu()), _constants(rows)
    nic = sh.layer.inter_node_bandwidth * k["network_efficiency"]
    size, stride = np.array([4.0, 4.0]), np.array([1.0, 2.0])
    np.testing.assert_allclose(bus_bandwidth(Fabric.of(sh.layer, k), size, stride),
                               [2 * nic[0], nic[1]])


def test_groups_inside_a_node_run_on_nvlink_and_a_pipeline_over_nodes_on_one_nic() -> None:
    rows = table(num_gpus=32, tp=[1, 2, 8], pp=[1, 4])
    sh, k = Shapes.of(rows, clusters_by_gpu()), _constants(rows)
    links = step_links(sh, k)
    nvlink = sh.layer.intra_node_bandwidth * k["nvlink_efficiency"]
    nic = sh.layer.inter_node_bandwidth * k["network_efficiency"]
    # tp <= 8 GPUs a node
    np.testing.assert_array_equal(layer_links(sh.layer, k).tensor_parallel, nvlink)
    np.testing.assert_array_equal(links.pipeline_hop, nic)  # 32 GPUs span 4 nodes
    # The gradient group (dp ranks, tp apart) fits in a node only at pp 4 (tp·dp = 8).
    inside = (rows["tp"] * rows["dp"] <= 8).to_numpy()
    assert inside.any() and not inside.all()
    np.testing.assert_array_equal(links.gradient[inside], nvlink[inside])
    assert (links.gradient[~inside] < nvlink[~inside]).all()


def test_each_rows_bandwidths_are_its_own_in_a_table_of_several_clusters() -> None:
    # Rows of two GPU kinds (constants and link speeds per row), worked out once per distinct
    # (tp, dp, cp, cluster): each row gets what its own layout and cluster give.
    rows = pd.concat([table(num_gpus=64, tp=[1, 2, 4, 8, 16], pp=[1, 2], cp=[1, 2]),
                      table(cluster="h100_sxm", num_gpus=64, tp=[2, 16], cp=[1, 4])],
                     ignore_index=True)
    sh, k = Shapes.of(rows, clusters_by_gpu()), _constants(rows)
    layer, fabric = sh.layer, Fabric.of(sh.layer, k)
    inside, between = layer_links(layer, k), step_links(sh, k)
    np.testing.assert_array_equal(inside.tensor_parallel, bus_bandwidth(fabric, layer.tp, 1.0))
    np.testing.assert_array_equal(between.gradient,
                                  bus_bandwidth(fabric, sh.dp * layer.cp, layer.tp))
    ring_inside = stays_in_node(layer.cp, layer.tp, layer.gpus_per_node, layer.num_gpus)
    assert ring_inside.any() and not ring_inside.all()
    np.testing.assert_array_equal(
        inside.context_ring,
        np.where(ring_inside, layer.intra_node_bandwidth * k["nvlink_efficiency"],
                 layer.inter_node_bandwidth * k["network_efficiency"]))
