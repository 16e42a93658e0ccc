"""The compiled kernels of the rows path (hpcreduce/ps/kernels) compute what numpy computes, bit for bit."""
from collections import Counter

import numpy as np
import pytest

from hpcreduce.arrays.hashing import GOLDEN, mix64
from hpcreduce.ps.dynamic_rows import SKETCH_CAP, DynamicTable
from hpcreduce.ps.id_index import IdIndex
from hpcreduce.ps.kernels import kernel
from hpcreduce.ps.multi_table import put_rows
from hpcreduce.ps.optimizers import CHUNK, OPTIMIZERS, make_optimizer
from hpcreduce.ps.placement import Placement
from hpcreduce.ps.tables import Dynamic, ParamSpec, counter_normal, dynamic_table
from hpcreduce.ps.updates import gather_rows, joined, sum_rows

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_row_optimizers_equal_gather_update_scatter(name, dtype):
    optimizer = make_optimizer(name, 0.05)
    values = RNG.standard_normal((40, 6)).astype(dtype)
    state = {key: np.abs(RNG.standard_normal((40, 6))).astype(dtype) for key in optimizer.state_names}
    expected, expected_state = values.copy(), {key: array.copy() for key, array in state.items()}
    local, grads = np.array([3, 17, 0, 39]), RNG.standard_normal((4, 6)).astype(dtype)
    for step in (1, 2, 9):
        optimizer.update_rows(values, state, local, grads, step)
        rows, gathered = expected[local], {key: array[local] for key, array in expected_state.items()}
        optimizer._rule(rows, grads, gathered, step)
        expected[local] = rows
        for key, array in gathered.items():
            expected_state[key][local] = array
    assert np.array_equal(values, expected)
    assert all(np.array_equal(state[key], expected_state[key]) for key in state)


@pytest.mark.parametrize("dtype,grad_dtype", [(np.float32, np.float32), (np.float64, np.float64),
                                              (np.float32, np.float64)])  # the last: by chunks
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_dense_updates_by_kernel_or_chunks_equal_the_rule_on_whole_arrays(name, dtype, grad_dtype):
    optimizer = make_optimizer(name, 0.05)
    shape = (3, CHUNK // 2 + 7)  # more than CHUNK elements, not a multiple of it
    param = RNG.standard_normal(shape).astype(dtype)
    state = {key: np.abs(RNG.standard_normal(shape)).astype(dtype) for key in optimizer.state_names}
    whole, whole_state = param.copy(), {key: array.copy() for key, array in state.items()}
    for step in (1, 2, 9):
        grad = RNG.standard_normal(shape).astype(grad_dtype)
        optimizer.update(param, grad, state, step)
        optimizer._rule(whole, grad, whole_state, step)
        np.testing.assert_array_equal(param, whole)
        for key in state:
            np.testing.assert_array_equal(state[key], whole_state[key])
    strided = np.asfortranarray(param)  # not C-contiguous: updated whole, in place all the same
    optimizer.update(strided, grad.copy(order="F"), {k: np.asfortranarray(a) for k, a in state.items()}, 10)
    optimizer._rule(whole, grad, whole_state, 10)
    np.testing.assert_array_equal(strided, whole)


def test_summed_duplicates_gathers_and_scatters_equal_numpy():
    ids, grads = RNG.integers(0, 30, 500), RNG.standard_normal((500, 5)).astype(np.float32)
    unique, total = sum_rows([(ids[:200], grads[:200]), (ids[200:], grads[200:])])
    expected_ids, inverse = np.unique(ids, return_inverse=True)
    expected = np.zeros((len(expected_ids), 5), np.float32)
    np.add.at(expected, inverse, grads)
    assert np.array_equal(unique, expected_ids) and np.array_equal(total, expected)
    values, where = RNG.standard_normal((50, 2, 3)).astype(np.float32), RNG.integers(0, 50, 80)
    assert np.array_equal(gather_rows(values, where), values[where])
    out, rows = np.zeros((50, 2, 3), np.float32), RNG.standard_normal((10, 2, 3)).astype(np.float32)
    put_rows(out, np.arange(0, 50, 5), rows)
    assert np.array_equal(out[::5], rows) and not out[1::5].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merged_sender_runs_equal_sum_rows_segment_by_segment(dtype):
    """merge_runs over segments of widths 3 and 1 from 3 senders (one sends nothing to segment 1,
    segment 2 gets one run only, segment 3 none) sums as sum_rows does, bit for bit."""
    widths, counts = np.array([3, 1, 3, 1]), np.array([[40, 0, 9, 0], [25, 30, 0, 0], [60, 12, 0, 0]])
    runs = [[np.unique(RNG.integers(0, 90, n)) for n in row] for row in counts]
    counts = np.array([[len(run) for run in row] for row in runs])
    ids = np.concatenate([runs[r][s] for s in range(4) for r in range(3)])
    grads = [[RNG.standard_normal((c, w)).astype(dtype) for c, w in zip(row, widths)] for row in counts]
    flat = np.concatenate([grads[r][s].reshape(-1) for s in range(4) for r in range(3)])
    id_start = np.concatenate([[0], np.cumsum(counts.sum(0))[:-1]])
    grad_start = np.concatenate([[0], np.cumsum(counts.sum(0) * widths)[:-1]])
    out_ids, out_grads, sums = np.empty_like(ids), np.empty_like(flat), np.zeros(4, np.int64)
    first = np.empty_like(ids)
    kernel("rows", "merge_runs")(ids, flat, counts, id_start, grad_start, widths, out_ids, out_grads, sums, first)
    for s in range(4):
        parts = [(runs[r][s], grads[r][s]) for r in range(3) if counts[r, s]]
        if not parts:
            assert sums[s] == 0
            continue
        expected_ids, expected = sum_rows(parts)
        n = sums[s]
        assert np.array_equal(out_ids[id_start[s]:id_start[s] + n], expected_ids)
        items = ids[id_start[s]:id_start[s] + counts[:, s].sum()]  # where each summed id first came
        assert first[id_start[s]:id_start[s] + n].tolist() == [int(np.flatnonzero(items == i)[0]) for i in expected_ids]
        got = out_grads[grad_start[s]:grad_start[s] + n * widths[s]].reshape(n, widths[s])
        assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))


def test_id_index_probe_insert_remove_move_with_any_int64():
    held = np.unique(RNG.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 5000, dtype=np.int64))
    index = IdIndex.of(held[:100])
    index.insert(held[100:], np.arange(100, len(held)))  # grows on the way
    assert np.array_equal(index.find(held), np.arange(len(held)))
    index.remove(held[:10])
    index.move(held[10:12], np.array([7, 8]))
    index.insert(held[:3], np.array([0, 1, 2]))  # removed cells reused
    assert index.find(held[:12]).tolist() == [0, 1, 2] + [-1] * 7 + [7, 8]
    absent = np.setdiff1d(np.arange(-50, 50), held)
    assert (index.find(absent) == -1).all()


def test_rendezvous_owners_equal_the_vectorised_scores():
    placement = Placement([ParamSpec("e", (10 ** 6, 4), sparse=True)], [0, 5, 2])
    ids = RNG.integers(0, 10 ** 6, 20000)
    with np.errstate(over="ignore"):
        scores = mix64(ids.astype(np.uint64)[None, :] ^ placement._salts[0][:, None])
    assert np.array_equal(placement.row_owners(0, ids), np.array([0, 5, 2])[np.argmax(scores, axis=0)])


def test_sketch_sighting_equals_the_vectorised_update():
    spec = dynamic_table("e", 2, Dynamic(admit_after=3, seed=4, budget_bytes=1 << 16))
    table = DynamicTable(0, spec, make_optimizer("sgd", 1.0), 2)
    sketch = table.sketch.copy()
    for _ in range(4):
        ids = np.unique(RNG.integers(0, 3000, 700))
        got = table._sighting(ids)
        with np.errstate(over="ignore"):  # the numpy code the kernel replaced
            hashed = ids.astype(np.uint64) * GOLDEN ^ table._salt
            width = np.uint64(sketch.shape[1])
            cells = [(mix64(hashed + np.uint64(d + 1) * GOLDEN) % width).astype(np.int64) for d in range(len(sketch))]
        counts = np.minimum(np.min([sketch[d, c] for d, c in enumerate(cells)], axis=0).astype(np.int64) + 1, SKETCH_CAP)
        for d, cell in enumerate(cells):
            sketch[d, cell] = np.maximum(sketch[d, cell], counts.astype(np.uint16))
        if table.sightings == 0:
            sketch >>= 1
        assert np.array_equal(got, counts) and np.array_equal(table.sketch, sketch)
    events = Counter()
    table.apply(np.array([10 ** 9]), np.ones((1, 2), np.float32), make_optimizer("sgd", 1.0), 1, events)
    assert events["seen"] == 1 and events["dropped"] == 1 and table.count == 0  # a first sighting: no row yet


def test_counter_normal_float32_from_the_kernel_equals_numpy():
    flat = np.arange(1 << 18, dtype=np.int64) * 3
    exact = counter_normal(5, "t", flat, 0.2, dtype="float64")  # numpy's formula
    assert np.array_equal(counter_normal(5, "t", flat, 0.2), exact.astype(np.float32))
    assert abs(exact.std() - 0.2) < 0.002


@pytest.mark.parametrize("bits", [1, 13, 25, 40])
def test_radix_unique_inverse_equals_torch_unique(bits):
    torch = pytest.importorskip("torch")
    unique_inverse = kernel("route", "unique_inverse")
    for n in (0, 1, 5000):
        keys = RNG.integers(0, 2 ** bits, n, dtype=np.int64)
        unique, inverse = unique_inverse(keys, bits)
        expected, expected_inverse = torch.unique(torch.from_numpy(keys), sorted=True, return_inverse=True)
        assert np.array_equal(unique, expected.numpy()) and np.array_equal(inverse, expected_inverse.numpy())


def test_table_keys_split_keys_and_bag_of_round_trip():
    table_keys, split_keys, bag_of = (kernel("route", n) for n in ("table_keys", "split_keys", "bag_of"))
    sizes, counts = np.array([5, 1, 7, 3], np.int64), np.array([4, 0, 6, 2], np.int64)
    ids = np.concatenate([RNG.integers(0, s, c) for s, c in zip(sizes, counts)]).astype(np.int64)
    keys, outside = table_keys(ids, counts, sizes)
    assert outside == -1 and np.array_equal(keys, ids + np.repeat([0, 5, 6, 13], counts))
    local, starts = split_keys(np.unique(keys), sizes)
    for t in range(len(sizes)):
        assert np.array_equal(local[starts[t]:starts[t + 1]], np.unique(ids[sum(counts[:t]):sum(counts[:t + 1])]))
    bad = ids.copy()
    bad[5] = 7  # table 2 (7 rows) its second id: one past its last row
    assert table_keys(bad, counts, sizes)[1] == 5 and table_keys(-ids - 1, counts, sizes)[1] == 0
    assert np.array_equal(split_keys(np.empty(0, np.int64), sizes)[1], np.zeros(5))
    lengths = np.array([2, 0, 3, 1], np.int64)
    assert np.array_equal(bag_of(lengths), np.repeat(np.arange(4), lengths))


@pytest.mark.parametrize("scaled", [False, True])
def test_pooled_grad_equals_index_select_then_index_add(scaled):
    torch = pytest.importorskip("torch")
    grad, inverse = torch.randn(300, 16), torch.from_numpy(RNG.integers(0, 90, 1200))
    bag_of = torch.from_numpy(np.sort(RNG.integers(0, 300, 1200)))
    scale = torch.rand(1200) if scaled else None
    per_lookup = grad.index_select(0, bag_of) * (scale.unsqueeze(1) if scaled else 1)
    expected = torch.zeros(90, 16).index_add_(0, inverse, per_lookup)
    out = torch.zeros(90, 16)
    kernel("rows", "pooled_grad")(out.numpy(), inverse.numpy(), bag_of.numpy(), grad.numpy(),
                                  (scale if scaled else torch.empty(0)).numpy())
    assert torch.equal(out, expected)


def test_joined_views_adjacent_pieces_and_copies_the_rest():
    rows = RNG.standard_normal((10, 4)).astype(np.float32)
    as_bytes = rows.reshape(-1).view(np.uint8)  # pieces of a pull's byte buffer
    pieces = [as_bytes[0:48].view(np.float32).reshape(3, 4), as_bytes[48:160].view(np.float32).reshape(7, 4)]
    view = joined(pieces)
    assert np.shares_memory(view, rows) and np.array_equal(view, rows)
    for apart in ([rows[0:3], rows[4:6]], [rows[3:5], rows[0:3]], [rows[0:3], rows[3:6].copy()]):
        copy = joined(apart)
        assert not np.shares_memory(copy, rows) and np.array_equal(copy, np.concatenate(apart))
