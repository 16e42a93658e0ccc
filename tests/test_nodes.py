"""Node awareness without a cluster: the picture of ranks per node, the PS replication ring
across nodes, and the two-link cost model's forecasts."""
import math

import pytest

from mpi_run import hpcreduce_cli

from hpcreduce.benchmarks import cost_model
from hpcreduce.benchmarks.cost_model import Link, StepCosts
from hpcreduce.ps.layout import Layout, node_ring
from hpcreduce.ps.tables import ParamSpec
from hpcreduce.runtime.hosts import unknown_hosts
from hpcreduce.runtime.nodes import describe, ranks_by_node


def test_ranks_by_node_and_its_description():
    nodes = ["node1", "node1", "node2", "node2", "node1"]
    assert ranks_by_node(nodes) == {"node1": [0, 1, 4], "node2": [2, 3]}
    assert describe(nodes) == "2 nodes: node1 (ranks 0,1,4), node2 (ranks 2-3)"
    assert describe(["vm"]) == "1 node: vm (rank 0)"


@pytest.mark.parametrize("counts", [(2, 2), (3, 3), (3, 2, 1), (2, 2, 2, 2), (4, 4), (1, 1)])
def test_node_ring_puts_every_replica_on_another_node(counts):
    nodes = {}
    for node, count in enumerate(counts):
        for _ in range(count):
            nodes[len(nodes)] = f"n{node}"  # block placement: a node's servers are consecutive ranks
    ring = node_ring(list(nodes), nodes)
    assert sorted(ring) == list(nodes)
    assert all(nodes[ring[i]] != nodes[ring[(i + 1) % len(ring)]] for i in range(len(ring))), ring


def test_layout_keeps_its_node_ring_after_a_server_is_lost():
    specs = [ParamSpec("w", (1000,))]
    layout = Layout.initial(specs, 6, 4, nodes=["a", "a", "b", "b", "a", "b"])
    assert layout.ring == (0, 2, 1, 3)
    assert {layout.neighbours(k)[0] for k in (0, 1)} == {2, 3}  # node a's shards back up on node b
    after = layout.rebuilt({0: 0, 1: 1, 3: 2}, [3, 4])  # the ring is recomputed over the survivors
    assert after.ring == (0, 3, 1) and after.neighbours(3) == (1, 0)
    six = Layout.initial(specs, 8, 6, nodes=["a", "a", "b", "b", "c", "c", "a", "b"])
    survivors = six.rebuilt({0: 0, 1: 1, 4: 2, 5: 3}, [4])  # node b lost: a, a, c, c alternate again
    assert all(survivors.key_nodes[k] != survivors.key_nodes[survivors.neighbours(k)[0]] for k in (0, 1, 4, 5))
    assert Layout.initial(specs, 5, 4, nodes=["a"] * 5).ring == (0, 1, 2, 3)  # one node: the old rule
    assert six.same_node_backups() == [] and Layout.initial(specs, 5, 4, nodes=["a"] * 5).same_node_backups() == []
    assert Layout.initial(specs, 4, 3, nodes=["a", "a", "b", "b"]).same_node_backups() == [1]  # 2 of 3 on a
    assert Layout.initial(specs, 4, 2).ring == (0, 1)  # without nodes: sorted keys, as before


def test_two_link_forecasts():
    within = Link(1e-6, 1e-10, 2, 5, 0.0)
    between = Link(20e-6, 1e-9, 2, 5, 0.0)
    n = 4 * 2**20
    flat = cost_model.ring_s(n, 16, between)
    assert math.isclose(flat, 30 * 20e-6 + 30 / 16 * n * 1e-9)
    hier = cost_model.hierarchical_s(n, 4, 4, within, between)
    assert math.isclose(hier, 4 * (1e-6 + n * 1e-10) + 6 * 20e-6 + 1.5 * n * 1e-9)
    costs = StepCosts(1e-3, 8e-3, 2e-3, 1024, n, n, 0.0)
    rows = cost_model.predict_nodes(costs, within, between, 8, [8, 64, 1024])
    assert [(r["nodes"], r["ranks"]) for r in rows] == [(8, 64), (64, 512), (1024, 8192)]
    for r in rows:  # compute from the runs, the network from the links
        compute = 1e-3 + 8e-3 / r["ranks"] + 2e-3
        assert math.isclose(r["ring_step_s"], compute + cost_model.ring_s(n, r["ranks"], between)), r
        assert r["hierarchical_step_s"] < r["ring_step_s"], r  # latency: M-1 hops, not N-1
        assert math.isclose(r["ps_step_s"], cost_model.ps_step_s(costs, between, r["ranks"], r["ps_servers"])), r
        assert r["fastest"] == min(("ring", "hierarchical", "ps"), key=lambda k: r[f"{k}_step_s"]), r
        assert math.isclose(r["hierarchical_samples_per_s"], 1024 / r["hierarchical_step_s"]), r
    one_way = [2e-6 + size * 3e-10 for size in (1e3, 1e5, 1e6)]
    fitted = cost_model.fit_link([1e3, 1e5, 1e6], one_way, 2, ring=False)
    assert math.isclose(fitted.alpha_s, 2e-6, rel_tol=1e-6)
    assert math.isclose(fitted.beta_s_per_byte, 3e-10, rel_tol=1e-6)


def test_placement_names_the_node_of_each_shard_and_its_replica():
    layout = Layout.initial([ParamSpec("w", (1000,))], 4, 2, nodes=["a", "b", "a", "b"])
    homes = layout.homes(["a", "b", "a", "b"], replicated=True)
    assert [(h["shard"], h["node"], h["replica_rank"], h["replica_node"]) for h in homes] == \
        [(0, "a", 1, "b"), (1, "b", 0, "a")]
    assert [h["replica_node"] for h in layout.homes(["a", "b", "a", "b"], replicated=False)] == [None, None]


def test_a_hostfile_naming_an_unknown_host_is_refused_by_name(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\nno-such-node.invalid slots=2\n")
    assert unknown_hosts(str(hosts)) == ["no-such-node.invalid"]
    assert unknown_hosts(str(hosts), ["--prtemca", "plm_ssh_agent", "/bin/agent"]) == []  # the agent decides
    for command in (["launch", "-n", "2", "--hostfile", str(hosts), "--", "true"],
                    ["train", "-n", "2", "--hostfile", str(hosts)]):
        done = hpcreduce_cli(*command, timeout=60)
        assert done.returncode == 2 and "names no-such-node.invalid: no such host" in done.output, done
