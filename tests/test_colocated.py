"""The colocated layout (``hpcreduce.ps.colocated``): shards on every trainer rank."""
import numpy as np
import pytest

from mpi_run import mpirun


def test_colocated_bsp_values_replicas_and_bad_input_at_2_and_3_ranks():
    for ranks in (2, 3):
        result = mpirun(ranks, "colocated_checks.py", timeout=120)
        assert result.returncode == 0, result.output
        assert "colocated checks passed" in result.output, result.output


def test_routes_group_items_by_destination_then_segment():
    from hpcreduce.ps.colocated.routes import block_starts, route
    found = route([np.array([1, 0, 1]), np.array([], np.int64), np.array([0, 0])], 2)
    assert found.counts.tolist() == [[1, 0, 2], [2, 0, 0]]
    assert found.items(0, 0).tolist() == [1] and found.items(0, 2).tolist() == [0, 1]
    assert found.items(1, 0).tolist() == [0, 2]
    assert block_starts(found.counts, np.array([4, 8, 2])).tolist() == [[0, 4, 4], [8, 16, 16]]


@pytest.mark.parametrize("where", ["before-push", "in-push"])
def test_trainers_sigkilled_mid_step_are_rebuilt_from_their_replicas_bit_for_bit(where):
    result = mpirun(3, "colocated_ft.py", where, ft=True, timeout=120)
    assert result.returncode == 0, result.output
    assert "rank 0 ends alone on the unkilled rows bit for bit" in result.output, result.output


def test_a_checkpoint_saved_at_3_ranks_loads_at_2_and_trains_to_the_same_rows(tmp_path):
    result = mpirun(3, "colocated_checkpoint.py", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.output
    assert "loaded at 2, same rows after training on" in result.output, result.output


def test_owner_sums_add_in_the_servers_order_bit_for_bit():
    from hpcreduce.ps.colocated.handles import summed
    from hpcreduce.ps.updates import sum_rows
    rng = np.random.default_rng(3)
    parts = [(np.unique(rng.integers(0, 50, 40)), None) for _ in range(4)]
    parts = [(ids, rng.standard_normal((len(ids), 3)).astype(np.float32) * 10.0 ** rng.integers(-3, 4))
             for ids, _ in parts]
    ids, grads = summed(parts)
    want_ids, want = sum_rows(parts)
    assert np.array_equal(ids, want_ids) and grads.tobytes() == want.tobytes()


def test_replicas_go_to_another_node_where_there_are_two():
    from hpcreduce.ps import ParamSpec
    from hpcreduce.ps.colocated.layout import ColocatedLayout
    layout = ColocatedLayout([ParamSpec("a", (100, 2), sparse=True)], [0, 1, 2, 3], ["n1", "n1", "n2", "n2"])
    assert all(layout.nodes[layout.rank_of(layout.successor[k])] != layout.nodes[layout.rank_of(k)]
               for k in layout.keys)
    survivors = ColocatedLayout(layout.specs, [0, 2, 3], ["n1", "n2", "n2"])  # key 1 lost: only its rows move
    ids = np.arange(100)
    before, after = layout.owner_ranks(0, ids), survivors.owner_ranks(0, ids)
    kept = before != 1
    assert (np.array([0, 2, 3])[after[kept]] == np.array([0, 1, 2, 3])[before[kept]]).all()
