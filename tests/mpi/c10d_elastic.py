"""torch's own DistributedDataParallel on the "hpcreduce" process group under ``hpcreduce.elastic``
(``hpcreduce.torch.c10d.elastic.run``, 3 ranks, --ft): rank 2 SIGKILLs itself inside step
``KILL_AT``'s forward; the survivors' DDP backward fails, they shrink, restore their last commit,
rebuild the process group and DDP over 2 ranks, and end, after ``STEPS`` steps of a fixed global
batch split evenly over whoever is there, equal to one process stepping on the whole batch (1e-5).
Prints the kill's time ("killed at T"), then on rank 0 "detected at T", "recovered in S" and "ok"."""
import os
import signal
import time

import torch
import torch.distributed as dist

import hpcreduce
import hpcreduce.torch  # noqa: F401  (registers the backend)
from hpcreduce import elastic
from hpcreduce.torch.c10d.elastic import run

STEPS, KILL_AT, BATCH, VICTIM = 10, 4, 12, 2

torch.set_num_threads(1)
ctx = hpcreduce.init(ft=True)
dist.init_process_group("hpcreduce")


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 8, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def step_on(module: torch.nn.Module, optimizer, x, y) -> None:
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(module(x), y).backward()
    optimizer.step()


net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
state = elastic.State(model=net, optimizer=opt, step=0)


@run
def train(state):
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    while state.step < STEPS:
        x, y = (part.chunk(ctx.size)[ctx.rank] for part in batch(state.step))
        if state.step == KILL_AT and ctx.size == 3 and ctx.rank == VICTIM:
            print(f"killed at {time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        step_on(ddp, opt, x, y)
        state.step += 1
        state.commit()


train(state)
assert ctx.size == 2 and dist.get_world_size() == 2, (ctx.size, dist.get_world_size())
flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
assert all(torch.equal(flat, other) for other in ctx.comm.allgather(flat)), "the survivors' models differ"
if ctx.rank == 0:
    alone = model()
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.2, momentum=0.9)
    for step in range(STEPS):
        step_on(alone, alone_opt, *batch(step))
    difference = max(float((a - b).detach().abs().max()) for a, b in zip(net.parameters(), alone.parameters()))
    event = state.events[0]
    print(f"detected at {event['detected_at']:.6f}\nrecovered in {event['recovered_s']:.3f}\n"
          f"difference {difference:.2e}", flush=True)
    assert difference <= 1e-5, f"{difference:.3e} from one process"
    print("ok", flush=True)
dist.destroy_process_group()
