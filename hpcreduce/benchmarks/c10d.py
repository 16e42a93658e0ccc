"""``hpcreduce bench c10d``: torch.distributed over "hpcreduce" against gloo, in the same run.

The default process group is the backend's (``--backend``, "hpcreduce"); a gloo group of the
same ranks stands beside it. Every operation of ``c10d_ops`` at each of ``--sizes``, then the
steps of torch's own DistributedDataParallel (``mlp``, ``cnn``) and FSDP2 (``fully_shard`` on
the MLP, over a 1-D mesh of either group) and, where TorchRec imports, its
``DistributedModelParallel`` (``torchrec_peer``: the DLRM's tables table-wise, 8 x 100K x 16,
batch 512), each pair timed interleaved (``timing``), one torch
thread per rank. Figures: each operation's speed against gloo's (gloo's time over ours: above 1
is faster; targets 1.2x from 1 MiB, 1.0x at 64 KiB for ``HEADLINE``) and each step's
time against gloo's (ours over gloo's: targets 0.8x DDP MLP, 1.0x DDP CNN and FSDP2).
"""
from __future__ import annotations

from typing import Dict, List

from mpi4py import MPI

from ..runtime.context import Context
from .timing import format_size, interleaved_medians, iterations_for, launch_facts

NAME = "c10d"
HELP = "torch.distributed over the hpcreduce backend against gloo: every operation, DDP and FSDP2 steps"
OPERATIONS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
              "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "send_recv",
              "batch_isend_irecv", "barrier")
"""``c10d_ops.calls``' operations; the first four (``HEADLINE``) are the ones the issue's targets name."""
HEADLINE = OPERATIONS[:4]
BATCH = {"mlp": 64, "cnn": 16, "dlrm": 512}
STEP_TARGETS = {"ddp_mlp": 0.8, "ddp_cnn": 1.0, "fsdp2_mlp": 1.0, "torchrec_dlrm": 1.0}


def run(context: Context, args) -> Dict[str, object]:
    import torch  # not imported with the command: torch is optional and slow to import
    import torch.distributed as dist
    from .c10d_ops import calls, unsupported
    from .c10d_peers import start
    torch.set_num_threads(1)
    comm = context.comm
    gloo = start(args.backend, MPI.COMM_WORLD)
    ops: List[Dict[str, object]] = []
    for index, nbytes in enumerate(args.sizes):
        ours, theirs = calls(nbytes, None), calls(nbytes, gloo)
        for op in args.ops.split(","):
            if op == "barrier" and index:
                continue  # no payload: once
            pair = {"ours": ours[op], "gloo": theirs[op]}
            problems = {name: next((why for why in comm.allgather(unsupported(call)) if why), None)
                        for name, call in pair.items()}  # a rank's refusal stops every rank's timing
            timed = {name: call for name, call in pair.items() if problems[name] is None}
            medians = interleaved_medians(comm, timed, warmup=args.warmup,
                                          iterations=iterations_for(nbytes, budget_bytes=256 << 20, most=args.most))
            ops.append({"op": op, "bytes": nbytes, "s": medians, "not_run": {k: v for k, v in problems.items() if v}})
    steps = [step_row(case, gloo, comm, args) for case in args.steps.split(",")]
    dist.destroy_process_group()
    return {"benchmark": NAME, "launch": launch_facts(comm), "backend": args.backend, "ops": ops, "steps": steps}


def step_row(case: str, gloo, comm: MPI.Intracomm, args) -> Dict[str, object]:
    """``case``'s step on the default group and on ``gloo``, timed interleaved; TorchRec's with
    its examples/s and each side's last loss (or why it did not run)."""
    from .c10d_peers import step_pair
    pair, batch, losses = step_pair(case, gloo, BATCH)
    if not pair:
        return {"step": case, "not_run": losses}
    medians = interleaved_medians(comm, pair, warmup=args.warmup, iterations=args.step_iterations,
                                  shuffle=True, settle=args.settle)
    return {"step": case, "batch_per_rank": batch, "s": medians,
            "examples_per_s": {name: batch * comm.Get_size() / seconds for name, seconds in medians.items()},
            "loss": {name: loss() for name, loss in losses.items()}}


def render(result: Dict[str, object]) -> str:
    launch = result["launch"]
    lines = [f"torch.distributed over {result['backend']!r} against gloo, {launch['ranks']} ranks on "
             f"{launch['cores']} cores ({launch['ranks_per_node']} per node), one torch thread per rank "
             f"(medians, ms; speed: gloo's time over ours)"]
    for row in result["ops"]:
        times, size = row["s"], format_size(row["bytes"])
        if "ours" not in times or "gloo" not in times:
            only = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in times.items())
            lines.append(f"  {row['op']:24s} {size:>8s}  {only}; not run: {row['not_run']}")
            continue
        speed = times["gloo"] / times["ours"]
        target = "" if row["op"] not in HEADLINE or row["bytes"] < 64 << 10 else \
            f"  (target {1.2 if row['bytes'] >= 1 << 20 else 1.0:.1f}x)"
        lines.append(f"  {row['op']:24s} {size:>8s}  ours {times['ours'] * 1e3:9.3f}  gloo "
                     f"{times['gloo'] * 1e3:9.3f}  {speed:5.2f}x{target}")
    for row in result["steps"]:
        if "s" not in row:
            lines.append(f"  step {row['step']:19s} not run: {row['not_run']}")
            continue
        times, rate, loss = row["s"], row["examples_per_s"], row["loss"]
        lines.append(f"  step {row['step']:19s} batch {row['batch_per_rank']:3d}  ours {times['ours'] * 1e3:9.3f}  "
                     f"gloo {times['gloo'] * 1e3:9.3f}  {times['ours'] / times['gloo']:5.2f}x gloo's time "
                     f"(target <= {STEP_TARGETS[row['step']]:.1f}x); examples/s {rate['ours']:.0f} against "
                     f"{rate['gloo']:.0f}, last loss {loss['ours']:.5f} against {loss['gloo']:.5f}")
    return "\n".join(lines)
