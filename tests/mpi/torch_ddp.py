"""hpcreduce.torch.DistributedDataParallel at any N >= 2: training equals one process averaging
every rank's gradient (on the reduction thread and at the end of backward, no_sync, unused
parameters, 16-bit wires); bad input on
one rank only raises on every rank, naming the parameter, and nothing hangs."""
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import InputMismatchError, TrainingError, UnsupportedInputError
from mpi_checks import expect_raised, run_checks

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
torch.set_num_threads(1)


class Net(torch.nn.Module):
    """An MLP with a branch that some ranks may leave unused."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Tanh(), torch.nn.Linear(width, width),
                                        torch.nn.Tanh(), torch.nn.Linear(width, 3))
        self.extra = torch.nn.Linear(8, 3)

    def forward(self, x, use_extra=True):
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


def batch(step: int, who: int):
    g = torch.Generator().manual_seed(1000 * step + who)
    return torch.randn(12, 8, generator=g), torch.randint(0, 3, (12,), generator=g)


def reference_step(model, opt, step: int, use_extra=lambda who: True, micro=1):
    """One process: the mean over ranks of every rank's gradient, then the optimizer step."""
    grads = None
    for who in range(size):
        model.zero_grad()
        for m in range(micro):
            x, y = batch(step * micro + m, who)
            torch.nn.functional.cross_entropy(model(x, use_extra(who)), y).backward()
        mine = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        grads = mine if grads is None else [a + b for a, b in zip(grads, mine)]
    for p, g in zip(model.parameters(), grads):
        p.grad = g / size
    opt.step()


def train_both(steps=4, use_extra=lambda who: True, micro=1, hook=None, width=16, cap=0.001, set_to_none=True,
               **options):
    torch.manual_seed(rank)  # different on every rank: construction broadcasts rank 0's
    model = Net(width)
    ddp = hpt.DistributedDataParallel(model, bucket_cap_mb=cap, **options)
    if hook is not None:
        ddp.register_comm_hook(*hook)
    reference = Net(width)
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        for m in range(micro):
            x, y = batch(step * micro + m, rank)
            if m < micro - 1:
                with ddp.no_sync():
                    torch.nn.functional.cross_entropy(ddp(x, use_extra(rank)), y).backward()
            else:
                torch.nn.functional.cross_entropy(ddp(x, use_extra(rank)), y).backward()
        opt.step()
        reference_step(reference, ref_opt, step, use_extra, micro)
    return model, reference


def assert_close(model, reference, tolerance):
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        error = float((a - b).detach().abs().max())
        assert error <= tolerance * (1 + float(b.detach().abs().max())), f"rank {rank}: {name} off by {error}"


def check_equals_one_process():
    for overlap in (True, False):
        assert_close(*train_both(overlap=overlap), 1e-5)


def check_large_buckets_reduced_where_autograd_left_them():
    """Buckets past the one-shot size (the hierarchical allreduce reading autograd's tensors in
    place, the NaN/Inf verdict taken in its copy out): one process's numbers; a NaN or an Inf on
    one rank stops every rank, naming the parameter."""
    for overlap, set_to_none in ((False, True), (True, False)):
        assert_close(*train_both(width=256, cap=25, overlap=overlap, set_to_none=set_to_none), 1e-5)
    ddp = hpt.DistributedDataParallel(Net(256))
    for bad in (float("nan"), float("inf")):
        x, y = batch(0, rank)
        if rank == size - 1:
            x[0, 0] = bad
        expect_raised(TrainingError, "body.0.weight",
                      lambda: torch.nn.functional.cross_entropy(ddp(x), y).backward(), rank)
        ddp.module.zero_grad()


def check_no_sync_accumulates():
    assert_close(*train_both(micro=3, overlap=True), 1e-5)


def check_unused_parameter_counts_as_zeros():
    for overlap in (True, False):
        assert_close(*train_both(use_extra=lambda who: who != 1, overlap=overlap), 1e-5)


def check_compressed_wires():
    for compression in ("bf16", "fp16"):
        assert_close(*train_both(compression=compression), 2e-2)


def check_different_modules_refused():
    model = torch.nn.Linear(4, 3 if rank == size - 1 else 2)
    expect_raised(InputMismatchError, "DistributedDataParallel", lambda: hpt.DistributedDataParallel(model), rank)
    sparse = torch.nn.Embedding(10, 3, sparse=rank == 1)
    expect_raised(UnsupportedInputError, "sparse", lambda: hpt.DistributedDataParallel(sparse), rank)
    ints = torch.nn.Linear(2, 2)
    expect_raised(UnsupportedInputError, "compression 'int8'",
                  lambda: hpt.DistributedDataParallel(ints, compression="int8" if rank == 0 else None), rank)


def check_nan_on_one_rank_stops_every_rank():
    """Into the bucket views (the first step) and reduced where autograd left the gradients
    (after zero_grad(): the default hook writes the mean back into them), small buckets and one."""
    for cap, after_zero_grad in ((0.001, False), (0.001, True), (25, True)):
        ddp = hpt.DistributedDataParallel(Net(), bucket_cap_mb=cap, overlap=True)
        if after_zero_grad:
            torch.nn.functional.cross_entropy(ddp(batch(2, rank)[0]), batch(2, rank)[1]).backward()
            ddp.module.zero_grad()
        x, y = batch(0, rank)
        if rank == 1:
            x[0, 0] = float("nan")
        expect_raised(TrainingError, "body.0.weight",
                      lambda: torch.nn.functional.cross_entropy(ddp(x), y).backward(), rank)
        ddp.module.zero_grad()
        x, y = batch(1, rank)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()  # the next step goes on


def check_changed_shape_on_one_rank():
    """A parameter replaced, or the submodule holding one (same shapes), on one rank."""
    def replace_parameter(model):
        model.extra.weight = torch.nn.Parameter(torch.zeros(3, 8))

    def replace_submodule(model):
        model.body[2] = torch.nn.Linear(16, 16)

    for change, named in ((replace_parameter, "extra.weight"), (replace_submodule, "body.2.weight")):
        model = Net()
        ddp = hpt.DistributedDataParallel(model, bucket_cap_mb=0.001)
        if rank == 1:
            change(model)
        x, y = batch(0, rank)
        expect_raised(TrainingError, named, lambda: torch.nn.functional.cross_entropy(ddp(x), y).backward(), rank)


class FailingBackward(torch.autograd.Function):
    """The identity, whose backward raises (after every parameter's gradient came)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("a user's backward failed")


def check_a_backward_that_raised_leaves_the_next_one_reduced():
    """A backward that raised in autograd (caught by the user, on every rank) before its end:
    the next step's gradients are the mean again, on the thread and at the end of backward."""
    for overlap in (True, False):
        model = Net()
        ddp = hpt.DistributedDataParallel(model, bucket_cap_mb=0.001, overlap=overlap)
        x, y = batch(0, rank)
        expect_raised(RuntimeError, "a user's backward failed", lambda: torch.nn.functional.cross_entropy(
            ddp(FailingBackward.apply(x.requires_grad_())), y).backward(), rank)
        model.zero_grad()
        x, y = batch(1, rank)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
        gathered = ctx.comm.allgather(grads)
        assert all((g == gathered[0]).all() for g in gathered), f"overlap={overlap}: gradients not reduced"


def check_step_inside_no_sync_refused():
    model = Net()
    ddp = hpt.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(0, rank)
    with ddp.no_sync():
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        expect_raised(UnsupportedInputError, "inside no_sync()", opt.step, rank)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()


def check_bfloat16_model():
    model = Net().to(torch.bfloat16)
    ddp = hpt.DistributedDataParallel(model, bucket_cap_mb=0.001)
    x, y = batch(0, rank)
    torch.nn.functional.cross_entropy(ddp(x.to(torch.bfloat16)), y).backward()
    grads = torch.cat([p.grad.reshape(-1).float() for p in model.parameters()])
    gathered = ctx.comm.allgather(grads.numpy())
    assert all((g == gathered[0]).all() for g in gathered), "bf16 gradients differ across ranks"


if __name__ == "__main__":
    run_checks(check_equals_one_process, check_large_buckets_reduced_where_autograd_left_them,
               check_no_sync_accumulates, check_unused_parameter_counts_as_zeros, check_compressed_wires, check_different_modules_refused, check_nan_on_one_rank_stops_every_rank,
               check_changed_shape_on_one_rank, check_a_backward_that_raised_leaves_the_next_one_reduced,
               check_step_inside_no_sync_refused, check_bfloat16_model)
    if rank == 0:
        print("torch ddp: all checks passed", flush=True)
