"""hpcreduce.torch.ZeroRedundancyOptimizer with DistributedDataParallel at any N >= 2 (slices that
do not divide evenly at N=3): 50 Adam steps equal the unsharded optimizer's to 1e-6, optimizer
state per rank about 1/N, consolidate/state_dict/load_state_dict round trip, a full state written at
N ranks loads at N-1 (re-sharded, the same values), so does a checkpoint (save_checkpoint after
consolidate_state_dict, load_checkpoint over fewer ranks), ZeRO-2 over two parameter groups keeps
the unsharded optimizer's state parameter by parameter, ZeRO-1 and ZeRO-2 over non-contiguous
parameters (channels_last, a transposed weight) step as the unsharded optimizer, add_param_group
re-partitions (as torch's Adam with the group added), and a non-elementwise
optimizer or different parameter groups on one rank raise on every rank."""
import shutil
import sys
import tempfile

import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import elastic
from hpcreduce.runtime.context import resolve
from hpcreduce import InputMismatchError, UnsupportedInputError
from mpi_checks import expect_raised, run_checks

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
torch.set_num_threads(1)


def mlp():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))


def train(make_optimizer, steps, model=None):
    model = model or mlp()
    ddp = hpt.DistributedDataParallel(model, bucket_cap_mb=0.0005)
    opt = make_optimizer(model)
    for step in range(steps):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(16, 7, generator=g), torch.randn(16, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return model, opt


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_sharded_adam_equals_unsharded():
    plain, plain_opt = train(lambda m: torch.optim.Adam(m.parameters(), lr=0.01), 50)
    zero, zero_opt = train(lambda m: hpt.ZeroRedundancyOptimizer(m.parameters(), torch.optim.Adam, lr=0.01), 50)
    error = float((flat(plain) - flat(zero)).abs().max())
    assert error <= 1e-6, f"rank {rank}: sharded Adam off by {error}"
    kept = sum(chunk.numel() for chunk in zero_opt.grads.chunks)
    total = flat(zero).numel()
    assert all(p.grad is None for p in zero.parameters()) and kept <= total / size + len(zero_opt.grads.chunks), \
        f"rank {rank}: ZeRO-2 keeps {kept} gradient values of {total}"
    full = sum(v.numel() * v.element_size() for s in plain_opt.state.values() for v in s.values()
               if v.dim() > 0)
    mine = zero_opt.state_bytes()
    assert mine <= full / size * 1.05 + 64 * len(zero_opt.slices), f"rank {rank}: {mine} state bytes of {full}"
    assert sum(ctx.comm.allgather(mine)) <= full + 8 * 4 * size, "the slices' states overlap"
    zero_opt.consolidate_state_dict(to=0)
    if rank == 0:
        state = zero_opt.state_dict()
        for index, values in plain_opt.state_dict()["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                difference = float((values[key] - state["state"][index][key]).abs().max())
                assert difference <= 1e-6, f"consolidated {key} of parameter {index} off by {difference}"
    else:
        expect_raised(RuntimeError, "consolidate_state_dict", zero_opt.state_dict, rank)
    state = ctx.comm.bcast(zero_opt.state_dict() if rank == 0 else None, root=0)
    again = hpt.ZeroRedundancyOptimizer(zero.parameters(), torch.optim.Adam, lr=0.5)
    again.load_state_dict(state)
    assert again.param_groups[0]["lr"] == 0.01
    assert (zero_opt.stage, again.stage) == (2, 1), "over a wrapper's parameters ZeRO-2, alone ZeRO-1"
    reloaded = again.full_state_dict()["state"]
    for index, values in state["state"].items():
        assert torch.equal(values["exp_avg"], reloaded[index]["exp_avg"]), f"exp_avg of {index} changed"


def check_zero2_unused_parameters_nan_and_hooks():
    """ZeRO-2 over a wrapper with a layer no rank uses (its parameters untouched, as Adam leaves
    them unsharded); a NaN in one rank's gradient raises on every rank naming the parameter; a
    comm hook after the ZeRO-2 optimizer is refused on every rank."""
    def model():
        torch.manual_seed(6)
        return torch.nn.ModuleDict({"used": torch.nn.Linear(5, 9), "unused": torch.nn.Linear(3, 2)})

    results = []
    for sharded in (False, True):
        net = model()
        ddp = hpt.DistributedDataParallel(net, bucket_cap_mb=0.0001)
        opt = hpt.ZeroRedundancyOptimizer(net.parameters(), torch.optim.Adam, lr=0.01) if sharded \
            else torch.optim.Adam(net.parameters(), lr=0.01)
        for step in range(6):
            x = torch.randn(4, 5, generator=torch.Generator().manual_seed(step * 7 + rank))
            opt.zero_grad()
            ddp.module["used"](x).pow(2).mean().backward()
            opt.step()
        results.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
    assert float((results[0] - results[1]).abs().max()) <= 1e-6, f"rank {rank}: ZeRO-2 with an unused layer differs"
    assert torch.equal(results[1][-8:], torch.cat([p.detach().reshape(-1) for p in model()["unused"].parameters()]))
    x = torch.randn(4, 5)
    if rank == size - 1:
        x[0, 0] = float("nan")
    opt.zero_grad()
    expect_raised(hpcreduce.TrainingError, "used.weight", lambda: ddp.module["used"](x).sum().backward(), rank)
    expect_raised(UnsupportedInputError, "ZeRO-2", lambda: ddp.register_comm_hook(None, hpt.hooks.allreduce_hook), rank)


def check_other_optimizers_and_groups_refused():
    model = mlp()
    lbfgs = torch.optim.LBFGS if rank == size - 1 else torch.optim.Adam
    expect_raised(UnsupportedInputError, "'LBFGS' does not step element by element",
                  lambda: hpt.ZeroRedundancyOptimizer(model.parameters(), lbfgs, lr=0.1), rank)
    groups = [{"params": list(model[0].parameters())}, {"params": list(model[2].parameters()), "lr": 0.1 * (rank + 1)}]
    expect_raised(InputMismatchError, "hyperparameters",
                  lambda: hpt.ZeroRedundancyOptimizer(groups, torch.optim.SGD, lr=0.1), rank)


def check_sgd_groups_and_adagrad():
    for make in (lambda: torch.optim.SGD, lambda: torch.optim.Adagrad):
        cls = make()
        groups = lambda m: [{"params": list(m[0].parameters())}, {"params": list(m[2].parameters()), "lr": 0.05}]
        plain, _ = train(lambda m: cls(groups(m), lr=0.1, weight_decay=0.01), 10)
        zero, _ = train(lambda m: hpt.ZeroRedundancyOptimizer(groups(m), cls, lr=0.1, weight_decay=0.01), 10)
        error = float((flat(plain) - flat(zero)).abs().max())
        assert error <= 1e-6, f"rank {rank}: sharded {cls.__name__} off by {error}"


def check_zero2_two_groups_state_as_unsharded():
    """ZeRO-2 with the usual two groups (weight decay on the weights, none on the biases: the
    buckets' order is not the groups'): the parameters, ``full_state_dict`` and the consolidated
    ``state_dict`` equal the unsharded AdamW's, shapes and values, parameter by parameter."""
    def groups(m):
        return [{"params": [m[0].weight, m[2].weight], "weight_decay": 0.1},
                {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0}]

    plain, plain_opt = train(lambda m: torch.optim.AdamW(groups(m), lr=0.01), 8)
    zero, zero_opt = train(lambda m: hpt.ZeroRedundancyOptimizer(groups(m), torch.optim.AdamW, lr=0.01), 8)
    assert zero_opt.stage == 2
    error = float((flat(plain) - flat(zero)).abs().max())
    assert error <= 1e-6, f"rank {rank}: sharded AdamW over two groups off by {error}"
    want = plain_opt.state_dict()
    full = zero_opt.full_state_dict()
    zero_opt.consolidate_state_dict(to=size - 1)
    for got in [full] + ([zero_opt.state_dict()] if rank == size - 1 else []):
        assert [g["params"] for g in got["param_groups"]] == [g["params"] for g in want["param_groups"]]
        assert sorted(got["state"]) == sorted(want["state"]), (sorted(got["state"]), sorted(want["state"]))
        for index, values in want["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                mine = got["state"][index][key]
                assert mine.shape == values[key].shape, f"{key} of parameter {index}: {mine.shape}, {values[key].shape}"
                difference = float((values[key] - mine).abs().max())
                assert difference <= 1e-6, f"{key} of parameter {index} off by {difference}"


def cnn():
    """A channels_last CNN whose last layer's weight is a ``.t()`` view: parameters that are not contiguous."""
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 4, 3)).to(memory_format=torch.channels_last)
    model[3].weight = torch.nn.Parameter(model[3].weight.detach().t().contiguous().t())
    assert not model[0].weight.is_contiguous() and not model[3].weight.is_contiguous()
    return model


def check_non_contiguous_parameters():
    """ZeRO-1 (gradients by ``allreduce_gradients``) and ZeRO-2 over a channels_last CNN with a
    transposed weight: 6 Adam steps equal the unsharded ones, on every rank."""
    results = []
    for kind in ("plain", "zero1", "zero2"):
        model = cnn()
        ddp = hpt.DistributedDataParallel(model, bucket_cap_mb=0.0005) if kind != "zero1" else model
        opt = torch.optim.Adam(model.parameters(), lr=0.01) if kind == "plain" else \
            hpt.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.01)
        assert kind == "plain" or opt.stage == (2 if kind == "zero2" else 1)
        for step in range(6):
            g = torch.Generator().manual_seed(10 * step + rank)
            x = torch.randn(5, 2, 6, 6, generator=g).to(memory_format=torch.channels_last)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), torch.randn(5, 3, generator=g)).backward()
            if kind == "zero1":
                hpt.allreduce_gradients(model)
            opt.step()
        results.append(flat(model))
    for kind, result in zip(("zero1", "zero2"), results[1:]):
        error = float((results[0] - result).abs().max())
        assert error <= 1e-6, f"rank {rank}: {kind} over non-contiguous parameters off by {error}"


def check_add_param_group_repartitions():
    """ZeRO-1 over the first layer, 3 Adam steps, then ``add_param_group`` of the last layer (its
    own lr), 3 more: the parameters and the whole state equal torch's Adam doing the same; under
    ZeRO-2 the same call is refused on every rank."""
    results = []
    for sharded in (False, True):
        model = mlp()
        first = {"params": list(model[0].parameters())}
        opt = hpt.ZeroRedundancyOptimizer([first], torch.optim.Adam, lr=0.01) if sharded \
            else torch.optim.Adam([first], lr=0.01)
        for step in range(6):
            if step == 3:
                opt.add_param_group({"params": list(model[2].parameters()), "lr": 0.05})
            g = torch.Generator().manual_seed(10 * step + rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(torch.randn(16, 7, generator=g)), torch.randn(16, 3, generator=g)).backward()
            hpt.allreduce_gradients(model)
            opt.step()
        results.append((flat(model), opt.full_state_dict() if sharded else opt.state_dict()))
    error = float((results[0][0] - results[1][0]).abs().max())
    assert error <= 1e-6, f"rank {rank}: ZeRO-1 after add_param_group off by {error}"
    want, got = results[0][1], results[1][1]
    assert [g["params"] for g in got["param_groups"]] == [[0, 1], [2, 3]] and got["param_groups"][1]["lr"] == 0.05
    for index, values in want["state"].items():
        assert float((values["exp_avg"] - got["state"][index]["exp_avg"]).abs().max()) <= 1e-6, index
    model, opt = train(lambda m: hpt.ZeroRedundancyOptimizer(m.parameters(), torch.optim.Adam, lr=0.01), 1)
    expect_raised(UnsupportedInputError, "ZeRO-2", lambda: opt.add_param_group({"params": [torch.nn.Parameter(
        torch.zeros(3))]}), rank)


def check_state_written_at_n_loads_at_fewer():
    model, zero_opt = train(lambda m: hpt.ZeroRedundancyOptimizer(m.parameters(), torch.optim.Adam, lr=0.01), 5)
    full = zero_opt.full_state_dict()
    fewer = ctx.comm.Split(0 if rank < size - 1 else 1, rank)
    smaller = hpt.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, process_group=fewer, lr=0.5)
    smaller.load_state_dict(full)
    again = smaller.full_state_dict()
    for index, values in full["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(values[key], again["state"][index][key]), f"{key} of {index} changed when re-sharded"
    assert again["param_groups"][0]["lr"] == 0.01
    fewer.Free()


def check_checkpoint_written_at_n_loads_at_fewer():
    model, zero_opt = train(lambda m: hpt.ZeroRedundancyOptimizer(m.parameters(), torch.optim.Adam, lr=0.01), 3)
    state = elastic.State(model=model, optimizer=zero_opt)
    folder = ctx.comm.bcast(tempfile.mkdtemp() if rank == 0 else None, root=0)
    zero_opt.consolidate_state_dict(to=0)
    hpt.save_checkpoint(state, folder, 3)
    want = zero_opt.full_state_dict()
    fewer = ctx.comm.Split(0 if rank < size - 1 else 1, rank)
    again = mlp()
    loaded = hpt.ZeroRedundancyOptimizer(again.parameters(), torch.optim.Adam, process_group=fewer, lr=0.5)
    assert hpt.load_checkpoint(elastic.State(context=resolve(fewer), model=again, optimizer=loaded), folder) == 3
    got = loaded.full_state_dict()
    assert torch.equal(flat(again), flat(model)), "the checkpoint's parameters did not load"
    for index, values in want["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(values[key], got["state"][index][key]), f"{key} of {index} differs at {fewer.size} ranks"
    ctx.comm.Barrier()
    if rank == 0:
        shutil.rmtree(folder)


ZERO_CHECKS = (check_sharded_adam_equals_unsharded, check_zero2_unused_parameters_nan_and_hooks,
               check_other_optimizers_and_groups_refused,
               check_sgd_groups_and_adagrad, check_zero2_two_groups_state_as_unsharded, check_non_contiguous_parameters,
               check_add_param_group_repartitions,
               check_state_written_at_n_loads_at_fewer,
               check_checkpoint_written_at_n_loads_at_fewer)

if __name__ == "__main__":  # arguments: the names of the checks to run (none: all)
    run_checks(*[check for check in ZERO_CHECKS if check.__name__ in sys.argv[1:] or len(sys.argv) == 1])
    if rank == 0:
        print("torch zero: all checks passed", flush=True)
