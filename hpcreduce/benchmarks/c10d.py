"""``hpcreduce bench c10d``: torch.distributed over "hpcreduce" against gloo, in the same run.

The default process group is the backend's (``--backend``, "hpcreduce"); a gloo group of the
same ranks stands beside it. Every operation of ``c10d_ops`` at each of ``--sizes``, then the
steps of torch's own DistributedDataParallel (``mlp``, ``cnn``) and FSDP2 (``fully_shard`` on
the MLP, over a 1-D mesh of either group), each pair timed interleaved (``timing``), one torch
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
BATCH = {"mlp": 64, "cnn": 16}
STEP_TARGETS = {"ddp_mlp": 0.8, "ddp_cnn": 1.0, "fsdp2_mlp": 1.0}


def run(context: Context, args) -> Dict[str, object]:
    import torch  # not imported with the command: torch is optional and slow to import
    import torch.distributed as dist
    from .c10d_ops import calls, unsupported
    from .c10d_peers import ddp_step, fsdp_step, start
    from .torch_peers import MODELS
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
    steps: List[Dict[str, object]] = []
    for case in args.steps.split(","):
        kind, model = case.split("_")
        torch.manual_seed(0)
        initial = MODELS[model][0]().state_dict()
        if kind == "ddp":
            pair = {"ours": ddp_step(model, initial, BATCH[model])[0],
                    "gloo": ddp_step(model, initial, BATCH[model], gloo)[0]}
        else:
            from torch.distributed.device_mesh import DeviceMesh
            mesh = None if gloo is None else DeviceMesh.from_group(gloo, "cpu")
            pair = {"ours": fsdp_step(model, initial, BATCH[model])[0],
                    "gloo": fsdp_step(model, initial, BATCH[model], mesh)[0]}
        medians = interleaved_medians(comm, pair, warmup=args.warmup, iterations=args.step_iterations,
                                      shuffle=True, settle=args.settle)
        steps.append({"step": case, "batch_per_rank": BATCH[model], "s": medians})
    dist.destroy_process_group()
    return {"benchmark": NAME, "launch": launch_facts(comm), "backend": args.backend, "ops": ops, "steps": steps}


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
        times = row["s"]
        lines.append(f"  step {row['step']:19s} batch {row['batch_per_rank']:3d}  ours {times['ours'] * 1e3:9.3f}  "
                     f"gloo {times['gloo'] * 1e3:9.3f}  {times['ours'] / times['gloo']:5.2f}x gloo's time "
                     f"(target <= {STEP_TARGETS.get(row['step'], 1.0):.1f}x)")
    return "\n".join(lines)
