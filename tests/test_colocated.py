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
    from hpcreduce.ps.colocated.routes import route
    found = route([np.array([1, 0, 1]), np.array([], np.int64), np.array([0, 0])], 2)
    assert found.counts.tolist() == [[1, 0, 2], [2, 0, 0]]
    assert found.order.tolist() == [1, 3, 4, 0, 2] and found.offsets.tolist() == [0, 3, 3]


@pytest.mark.parametrize("where", ["before-push", "in-push"])
def test_trainers_sigkilled_mid_step_are_rebuilt_from_their_replicas_bit_for_bit(where):
    result = mpirun(3, "colocated_ft.py", where, ft=True, timeout=120)
    assert result.returncode == 0, result.output
    assert "rank 0 ends alone on the unkilled rows bit for bit" in result.output, result.output


@pytest.mark.parametrize("where", ["before-push", "in-push"])
def test_table_wise_owners_sigkilled_mid_step_are_rebuilt_from_their_replicas_bit_for_bit(where):
    result = mpirun(3, "tablewise_ft.py", where, ft=True, timeout=120)
    assert result.returncode == 0, result.output
    assert "rank 0 ends alone on the unkilled rows bit for bit" in result.output, result.output


def test_a_checkpoint_saved_at_3_ranks_loads_at_2_and_trains_to_the_same_rows(tmp_path):
    result = mpirun(3, "colocated_checkpoint.py", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.output
    assert "loaded at 2, same rows after training on" in result.output, result.output


def test_items_of_several_widths_go_to_wire_order_and_blocks_regroup_by_segment():
    from hpcreduce.ps.colocated.flat import move, natural_to_wire, regroup
    from hpcreduce.ps.colocated.routes import route
    widths = np.array([4, 8, 2])
    found = route([np.array([1, 0, 1]), np.array([0]), np.array([0, 1])], 2)
    lengths = found.counts.sum(0)
    natural = np.arange(int((lengths * widths).sum()), dtype=np.uint8)
    natural_at, wire_at, width = natural_to_wire(found.order, lengths, widths)
    wire = np.zeros_like(natural)
    move(natural, natural_at, wire, wire_at, width, 2)
    item = np.split(natural, np.cumsum(np.repeat(widths, lengths))[:-1])  # natural items: a0 a1 a2 b0 c0 c1
    assert wire.tobytes() == b"".join(item[k].tobytes() for k in [1, 3, 4, 0, 2, 5])  # rank 0: a1 b0 c0; 1: a0 a2 c1
    back = regroup(wire, found.counts * widths)  # a receiver's blocks by segment, ranks in order
    assert back.tobytes() == b"".join(item[k].tobytes() for k in [1, 0, 2, 3, 4, 5])
    assert regroup(back, found.counts * widths, to_segments=False).tobytes() == wire.tobytes()


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
