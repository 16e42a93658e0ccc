"""hpcreduce.torch.DistributedDataParallel's comm hooks, unused and frozen parameters and argument
checks at any N >= 2: built-in and user hooks train like one process, fp16 equals
allreduce_gradients bit for bit, PowerSGD sends less and still trains; a hook that raises,
returns the wrong thing or differs on one rank raises on every rank; parameters no rank used keep
``grad is None`` and end equal to torch DDP over gloo's; a bad argument on one rank raises on all.
Then tests/mpi/torch_zero.py's checks of ZeroRedundancyOptimizer (one job for both: torch's import
is most of a job's time)."""
import gc
import socket

import torch
import torch.distributed as dist

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import InputMismatchError, TrainingError, UnsupportedInputError
from hpcreduce.torch import hooks
from mpi_checks import expect_raised, run_checks
from torch_ddp import Net, assert_close, batch, train_both
from torch_zero import ZERO_CHECKS

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
torch.set_num_threads(1)


def user_hook(state, bucket):
    """The docs' example: count the buckets, then the mean."""
    state["buckets"] += 1
    buffer = bucket.buffer()
    buffer.div_(hooks.get_world_size())
    return hooks.all_reduce(buffer, "sum")


def check_hooks_train_like_one_process():
    assert_close(*train_both(hook=(None, hooks.allreduce_hook)), 1e-5)
    counted = {"buckets": 0}
    assert_close(*train_both(hook=(counted, user_hook), overlap=True), 1e-5)
    assert counted["buckets"] > 4, counted
    for hook in (hooks.fp16_compress_hook, hooks.bf16_compress_hook):
        assert_close(*train_both(hook=(None, hook)), 2e-2)


def check_fp16_equals_allreduce_gradients():
    torch.manual_seed(3)
    model = Net().half()
    twin = Net().half()
    ddp = hpt.DistributedDataParallel(model, bucket_cap_mb=0.001)
    twin.load_state_dict(model.state_dict())
    x, y = batch(0, rank)
    torch.nn.functional.cross_entropy(ddp(x.half()).float(), y).backward()
    torch.nn.functional.cross_entropy(twin(x.half()).float(), y).backward()
    hpt.allreduce_gradients(twin)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a.grad, b.grad), f"rank {rank}: {name} differs from allreduce_gradients"


def check_powersgd_compresses_and_trains():
    state = hooks.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    ddp = hpt.DistributedDataParallel(model)
    ddp.register_comm_hook(state, hooks.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    torch.manual_seed(1)
    target = torch.nn.Linear(64, 4)
    losses, sent = [], []
    for step in range(40):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 64, generator=g)
        with torch.no_grad():
            y = target(x)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        sent.append(ddp.wire_bytes())
    assert state.iter == 40, state.iter
    assert sent[-1] * 5 < sent[0], f"PowerSGD sent {sent[-1]} bytes, float32 {sent[0]}"
    assert losses[-1] < 0.1 * losses[0], losses
    gathered = ctx.comm.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy())
    assert all((g == gathered[0]).all() for g in gathered), "PowerSGD left the ranks' parameters different"


def failing_hook(state, bucket):
    """Raises on the last rank only, in the first bucket or the last (after the peers reduced all)."""
    if rank == size - 1 and (bucket.index() == 0 if state == "first" else bucket.is_last()):
        raise RuntimeError("boom in the hook")
    return hooks.allreduce_hook(None, bucket)


def short_hook(_state, bucket):
    """Rank 0 returns one value too few (and reduces nothing)."""
    if rank != 0:
        return hooks.allreduce_hook(None, bucket)
    future = torch.futures.Future()
    future.set_result(bucket.buffer()[:-1])
    return future


def backward_with(hook, state=None, overlap=True):
    ddp = hpt.DistributedDataParallel(Net(), bucket_cap_mb=0.001, overlap=overlap)
    ddp.register_comm_hook(state, hook)
    x, y = batch(0, rank)
    return lambda: torch.nn.functional.cross_entropy(ddp(x), y).backward()


def check_failing_hooks_raise_on_every_rank():
    for overlap in (True, False):
        for where in ("first", "last"):
            expect_raised(TrainingError, "boom in the hook", backward_with(failing_hook, where, overlap), rank)
    expect_raised(TrainingError, "the bucket is torch.float32", backward_with(short_hook), rank)
    ddp = hpt.DistributedDataParallel(Net())
    expect_raised(InputMismatchError, "comm hook", lambda: ddp.register_comm_hook(
        None, hooks.allreduce_hook if rank else hooks.fp16_compress_hook), rank)
    compressed = hpt.DistributedDataParallel(Net(), compression="bf16")
    expect_raised(UnsupportedInputError, "registered already",
                  lambda: compressed.register_comm_hook(None, hooks.allreduce_hook), rank)


def check_hook_registered_on_one_rank_raises_on_all():
    """``register_comm_hook`` on the last rank only, the others going straight to backward (on a
    new wrapper, and after a step together): every rank raises naming the hooks, none waits."""
    for overlap, steps_before in ((True, 0), (False, 1)):
        ddp = hpt.DistributedDataParallel(Net(), bucket_cap_mb=0.001, overlap=overlap)
        x, y = batch(0, rank)
        backward = lambda: torch.nn.functional.cross_entropy(ddp(x), y).backward()  # noqa: E731
        for _ in range(steps_before):
            backward()
        if rank == size - 1:
            expect_raised(InputMismatchError, "powerSGD_hook", lambda: ddp.register_comm_hook(
                hooks.PowerSGDState(), hooks.powerSGD_hook), rank)
        else:
            expect_raised(InputMismatchError, "powerSGD_hook", backward, rank)


class Branchy(torch.nn.Module):
    """A trunk, a branch used only in step 0, a head frozen after wrapping, one never used."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(8, 8)
        self.branch = torch.nn.Linear(8, 3)
        self.head = torch.nn.Linear(8, 3)
        self.never = torch.nn.Linear(8, 3)

    def forward(self, x, step, who):
        h = torch.tanh(self.trunk(x))
        out = self.head(h)
        if step == 0 or (step == 1 and who == 0):
            out = out + self.branch(h)
        return out


def gloo_group():
    port = None
    if rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = ctx.comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)


def train_branchy(wrap, steps=5):
    torch.manual_seed(7)
    model = Branchy()
    wrapped = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    for step in range(steps):
        if step == 2:
            model.head.requires_grad_(False)
        opt.zero_grad()
        x, y = batch(step, rank)
        torch.nn.functional.cross_entropy(wrapped(x, step, rank), y).backward()
        opt.step()
    return model


def check_unused_and_frozen_parameters_like_torch_ddp():
    gloo_group()
    theirs = train_branchy(lambda m: torch.nn.parallel.DistributedDataParallel(m, find_unused_parameters=True))
    dist.destroy_process_group()
    for overlap in (True, False):
        ours = train_branchy(lambda m: hpt.DistributedDataParallel(m, overlap=overlap))
        assert ours.never.weight.grad is None and ours.branch.weight.grad is None, "an unused parameter got a grad"
        assert_close(ours, theirs, 1e-5)
        torch.manual_seed(7)
        start = Branchy()
        assert torch.equal(ours.never.weight, start.never.weight), "a parameter no rank used moved"
    model = Branchy()
    model.trunk.weight.grad = torch.ones_like(model.trunk.weight) * rank
    hpt.allreduce_gradients(model)
    assert model.never.weight.grad is None and model.branch.bias.grad is None
    assert torch.allclose(model.trunk.weight.grad, torch.full_like(model.trunk.weight, (size - 1) / 2))


def check_bad_arguments_on_one_rank_raise_on_all():
    last = rank == size - 1
    for cap in (float("nan"), float("inf"), -1.0, 0, "25", True, 1e300):
        expect_raised(UnsupportedInputError, "bucket_cap_mb", lambda: hpt.DistributedDataParallel(
            Net(), bucket_cap_mb=cap if last else 25.0), rank)
    for option in ("check_finite", "broadcast_buffers", "overlap"):
        expect_raised(UnsupportedInputError, option, lambda: hpt.DistributedDataParallel(
            Net(), **{option: "yes" if last else True}), rank)
    expect_raised(InputMismatchError, "check_finite", lambda: hpt.DistributedDataParallel(
        Net(), check_finite=not last), rank)
    expect_raised(UnsupportedInputError, "not a torch.nn.Module", lambda: hpt.DistributedDataParallel(
        "a model" if last else Net()), rank)
    expect_raised(UnsupportedInputError, "does not move the module", lambda: hpt.DistributedDataParallel(
        Net(), device_ids=[0] if last else None), rank)
    expect_raised(UnsupportedInputError, "both given", lambda: hpt.DistributedDataParallel(
        Net(), process_group=ctx if last else None, comm=ctx), rank)
    positional = hpt.DistributedDataParallel(Net(), None, None, 0, True, True, ctx, 0.001, True)  # torch's order
    assert positional.process_group is ctx and len(positional.reducer.buckets) > 1
    odd = torch.zeros(3, dtype=torch.int8 if last else torch.float32)
    expect_raised(UnsupportedInputError, "all_reduce: dtype torch.int8", lambda: hooks.all_reduce(odd), rank)


def check_guard_lives_with_the_wrapper():
    from hpcreduce.torch.step_guard import STEP_GUARD
    gc.collect()
    assert not STEP_GUARD.installed, "an optimizer pre-hook outlived every wrapper"
    ddp = hpt.DistributedDataParallel(Net())
    assert STEP_GUARD.installed
    del ddp
    gc.collect()
    assert not STEP_GUARD.installed, "the optimizer pre-hook outlived its wrapper"


if __name__ == "__main__":
    run_checks(check_guard_lives_with_the_wrapper, check_hooks_train_like_one_process,
               check_fp16_equals_allreduce_gradients, check_powersgd_compresses_and_trains,
               check_failing_hooks_raise_on_every_rank, check_hook_registered_on_one_rank_raises_on_all,
               check_unused_and_frozen_parameters_like_torch_ddp,
               check_bad_arguments_on_one_rank_raise_on_all, *ZERO_CHECKS)
    if rank == 0:
        print("torch hooks: all checks passed", flush=True)
