"""``hpcreduce bench torch``: the DDP wrapper against torch DDP (gloo) and a plain mpi4py loop.

Per model (``mlp``: 6 x 512-wide linear layers, 6.3 MB of gradients; ``cnn``: convolutions whose
backward takes longer than the reduction), every candidate of ``torch_peers`` steps in turn,
interleaved round by round (each round in another order; ``--settle`` untimed steps before each
timed one, so a candidate is timed warm, as in its own training loop), one torch thread per rank,
the same batch and the same starting parameters: median step times, each relative to torch DDP's,
to the plain loop's (each gradient reduced in place) and to the flat loop's (flattened, one
``MPI_Allreduce``, copied back), and the share of the plain loop's communication (its step minus
``compute``) that the wrapper hides. Then torch DDP and the wrapper train 30 steps more from the
same parameters: the largest parameter difference (target: 1e-6). Each step's CPU time (all of a
rank's threads, rank 0) beside its wall time shows whether a core was idle that overlap could
use. The NaN/Inf check's cost is the step with it against the same wrapper without it, and what it adds to the
copy out alone. Bytes
each rank sends per step are the collectives' own count (float32, bf16 and PowerSGD rank 4); the
sharded optimizer's state bytes per rank against the unsharded Adam's.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List

from mpi4py import MPI

from ..runtime.context import Context
from .timing import interleaved_medians, launch_facts

NAME = "torch"
HELP = "the torch DDP wrapper against torch DDP (gloo), allreduce_gradients and an mpi4py loop"
BATCH = {"mlp": 64, "cnn": 16}


def run(context: Context, args) -> Dict[str, object]:
    import torch  # not imported with the command: torch is optional and slow to import
    from .torch_peers import MODELS, candidates, start_gloo
    torch.set_num_threads(1)
    comm = context.comm
    start_gloo(comm)
    rows: List[Dict[str, object]] = []
    for model in args.models.split(","):
        torch.manual_seed(0)
        initial = MODELS[model][0]().state_dict()
        steps, modules, kept = candidates(model, comm, BATCH[model], initial, args.bucket_cap_mb)
        cpu: Dict[str, List[float]] = {name: [] for name in steps}
        medians = interleaved_medians(comm, {name: with_cpu_time(step, cpu[name]) for name, step in steps.items()},
                                      warmup=args.warmup, iterations=args.iterations, shuffle=True,
                                      settle=args.settle)
        wrapper = modules["hpcreduce_ddp"]
        row: Dict[str, object] = {"model": model, "batch_per_rank": BATCH[model], "step_s": medians,
                                  "cpu_s": {name: statistics.median(times[args.warmup * (args.settle + 1):])
                                            for name, times in cpu.items()},
                                  "gradient_bytes": sum(p.numel() * 4 for p in wrapper.parameters()),
                                  "bytes_sent_per_step": {name: kept[name].wire_bytes()
                                                          for name in steps if name.startswith("hpcreduce_ddp")
                                                          and name in kept},
                                  "optimizer_state_bytes": {name: state_bytes(kept[f"{name}.optimizer"])
                                                            for name in ("hpcreduce_ddp_adam", "hpcreduce_zero_adam")},
                                  "max_difference_vs_torch_ddp": agreement(model, comm, initial, args.bucket_cap_mb)}
        row["check_pass_s"] = check_pass(row["gradient_bytes"] // 4)
        rows.append({**row, **derived(medians)})
    return {"benchmark": NAME, "launch": launch_facts(comm), "bucket_cap_mb": args.bucket_cap_mb,
            "settle_steps": args.settle, "rows": rows}


def check_pass(count: int, repeats: int = 50) -> float:
    """Median seconds the wrapper's NaN/Inf check adds to a bucket of ``count`` float32 values,
    alone: the hierarchical allreduce's copy out (a mean divided) with the sum in the same pass
    (``finite_copy.finish_sum``) against the same copy without it (``finish_into``). The A/B of
    the steps is noisier than the pass it measures."""
    import numpy as np
    from ..collectives.finite_copy import finish_sum
    from ..collectives.ops import OPS
    reduced, out = np.random.default_rng(0).standard_normal(count, dtype=np.float32), np.empty(count, np.float32)
    finish_sum(OPS["mean"], reduced, out, 2)  # numba loaded (or compiled) before timing
    times: Dict[str, List[float]] = {"checked": [], "plain": []}
    for _ in range(repeats):
        for name, copy_out in (("checked", lambda: finish_sum(OPS["mean"], reduced, out, 2)),
                               ("plain", lambda: OPS["mean"].finish_into(reduced, out, 2))):
            started = time.perf_counter()
            copy_out()
            times[name].append(time.perf_counter() - started)
    return statistics.median(times["checked"]) - statistics.median(times["plain"])


def state_bytes(optimizer) -> int:
    """Bytes of optimizer state this rank holds (a sharded optimizer's: its slices')."""
    inner = getattr(optimizer, "optim", optimizer)
    return sum(v.numel() * v.element_size() for state in inner.state.values() for v in state.values()
               if getattr(v, "dim", lambda: 0)() > 0)


def with_cpu_time(step: Callable[[], None], times: List[float]) -> Callable[[], None]:
    """``step``, recording the CPU seconds this process (all its threads) spent in it."""
    def timed() -> None:
        started = time.process_time()
        step()
        times.append(time.process_time() - started)
    return timed


def derived(medians: Dict[str, float]) -> Dict[str, float]:
    """Ratios to the peers and the share of the loop's communication the wrapper hides."""
    loop_comm = medians["mpi4py_loop"] - medians["compute"]
    out = {}
    for name in medians:
        if name in ("compute", "torch_ddp"):
            continue
        out[f"{name}_vs_torch_ddp"] = medians[name] / medians["torch_ddp"]
        out[f"{name}_vs_loop"] = medians[name] / medians["mpi4py_loop"]
        out[f"{name}_vs_flat_loop"] = medians[name] / medians["mpi4py_flat_loop"]
    out["check_share_of_step"] = 1 - medians["hpcreduce_ddp_no_check"] / medians["hpcreduce_ddp"]
    out["allreduce_gradients_check_share"] = (1 - medians["allreduce_gradients_no_check"]
                                              / medians["allreduce_gradients"])
    for name in ("hpcreduce_ddp", "hpcreduce_ddp_thread"):
        exposed = medians[name] - medians["compute"]
        out[f"{name}_hidden_share"] = 1 - exposed / loop_comm if loop_comm > 0 else float("nan")
    return out


def agreement(model: str, comm: MPI.Intracomm, initial, cap_mb: float, steps: int = 30) -> float:
    """Largest parameter difference between torch DDP and the wrapper after ``steps`` steps."""
    from .torch_peers import candidates
    chosen, modules, _ = candidates(model, comm, BATCH[model], initial, cap_mb)
    for _ in range(steps):
        chosen["torch_ddp"]()
        chosen["hpcreduce_ddp"]()
    ours, theirs = modules["hpcreduce_ddp"].parameters(), modules["torch_ddp"].parameters()
    local = max(float((a - b).detach().abs().max()) for a, b in zip(ours, theirs))
    return comm.allreduce(local, op=MPI.MAX)


def render(result: Dict[str, object]) -> str:
    launch = result["launch"]
    lines = [f"torch step times, {launch['ranks']} ranks on {launch['cores']} cores, one torch thread per rank, "
             f"bucket cap {result['bucket_cap_mb']} MB, {result['settle_steps']} untimed steps before each timed one "
             f"(medians, ms: wall, and rank 0's CPU)"]
    for row in result["rows"]:
        times = row["step_s"]
        lines.append(f"{row['model']} ({row['gradient_bytes'] / 2 ** 20:.1f} MiB of gradients, batch "
                     f"{row['batch_per_rank']} per rank):")
        for name, seconds in times.items():
            ratios = "" if name in ("compute", "torch_ddp") else \
                f"  {row[f'{name}_vs_torch_ddp']:.2f}x torch DDP, {row[f'{name}_vs_loop']:.2f}x the loop, " \
                f"{row[f'{name}_vs_flat_loop']:.2f}x the flat one"
            lines.append(f"  {name:28s} {seconds * 1e3:8.2f} (cpu {row['cpu_s'][name] * 1e3:6.2f}){ratios}")
        sent = row["bytes_sent_per_step"]
        lines.append(f"  bytes each rank sends per step: {sent['hpcreduce_ddp'] / 2 ** 20:.2f} MiB (float32 wire), "
                     f"{sent['hpcreduce_ddp_bf16'] / 2 ** 20:.2f} MiB (bf16 wire), "
                     f"{sent['hpcreduce_ddp_powersgd'] / 2 ** 20:.3f} MiB (PowerSGD rank 4, "
                     f"{sent['hpcreduce_ddp'] / max(sent['hpcreduce_ddp_powersgd'], 1):.1f}x less)")
        state = row["optimizer_state_bytes"]
        lines.append(f"  Adam state bytes on rank 0: {state['hpcreduce_ddp_adam'] / 2 ** 20:.2f} MiB unsharded, "
                     f"{state['hpcreduce_zero_adam'] / 2 ** 20:.2f} MiB sharded "
                     f"({state['hpcreduce_zero_adam'] / max(state['hpcreduce_ddp_adam'], 1):.3f} of it); "
                     f"ZeRO step {row['hpcreduce_zero_adam_vs_loop'] / row['hpcreduce_ddp_adam_vs_loop']:.2f}x "
                     f"the unsharded wrapper's")
        lines.append(f"  the NaN/Inf check's share of the step: {row['check_share_of_step']:.3f} (wrapper), "
                     f"{row['allreduce_gradients_check_share']:.3f} (allreduce_gradients); what it adds to the "
                     f"copy out {row['check_pass_s'] * 1e3:.3f} ms "
                     f"({row['check_pass_s'] / times['hpcreduce_ddp']:.3f} of the step)")
        lines.append(f"  share of the loop's communication hidden: {row['hpcreduce_ddp_hidden_share']:.2f} (wrapper), "
                     f"{row['hpcreduce_ddp_thread_hidden_share']:.2f} (on the thread); "
                     f"largest parameter difference vs torch DDP after 30 steps: "
                     f"{row['max_difference_vs_torch_ddp']:.2e}")
    return "\n".join(lines)
