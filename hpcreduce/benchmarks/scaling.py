"""``hpcreduce bench scaling``: samples/s and parallel efficiency of ring and parameter-server
training at 1, 2, 4, 8 ranks, and an alpha-beta cost model's forecast up to 1024 ranks.

Run it outside any MPI job (a workstation, a login node, a batch script): it launches
every run itself, one ``hpcreduce train --json`` job per topology and rank count
(mpirun through hpcreduce's launcher, or ``--launcher srun`` inside an allocation):
ring on N = 1, 2, 4, 8 ranks, and PS on N = 2, 4, 8 ranks with ``--servers`` K (default
1) and N-K workers. Then one ``hpcreduce bench allreduce`` (on the most ranks that do not
oversubscribe the cores, at least 2) whose ring times fit the cost model's alpha and
beta (``cost_model``), and whose ping-pongs (``--links``) fit the two links, within a
node and between nodes; the ring runs' timelines split their steps into gradient,
optimizer, communication and wait time. The forecast is printed beside the
measurements, with a recommendation (docs/cost-model.md); with the two links, each run
beside its two-link forecast (by the nodes its ranks were on) and the flat ring, a
hierarchical allreduce (modelled) and the PS at 8 to 1024 nodes (``--predict-nodes``),
the compute per step taken from the runs. Under srun the runs spread over the
allocation's nodes (``-N``); mpirun fills each node's slots in turn.

- samples/s: the global batch times the steps after ``--warmup``, over their wall time.
- efficiency: samples/s / (N x the one-rank ring run's samples/s); N counts every rank of
  the run (PS servers too: the allocation pays for them).
- strong scaling by default (the global batch is split over the workers); ``--weak``
  keeps each worker's batch and grows the global batch with the workers.

Writes to ``--out DIR``: scaling.json (everything), scaling.csv (measured rows),
predictions.csv, node_predictions.csv, scaling.png, nodes.png (measured against the
two-link model, and the forecast by nodes), allreduce.json and allreduce_busbw.png, and
runs/ (each run's JSON and output). Runs with more ranks than cores are marked oversubscribed: their
figures show the machine, not the method. ``--device gpu``: every run trains on the ranks' GPUs
(``train --device gpu``) and the alpha-beta fit comes from ``bench allreduce --device gpu``'s
ring rows, the path this MPI gives device buffers (direct or staged through host memory).
"""
from __future__ import annotations

import csv
import json
import os
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..errors import LaunchError
from ..runtime.environment import usable_cores
from ..runtime.files import atomic_file, write_json
from ..runtime.jobs import run_job
from ..runtime import nodes
from ..runtime.hosts import hostfile_slots
from ..runtime.launch import LaunchPlan, build_mpirun
from . import cost_model

NAME = "scaling"
HELP = "throughput and efficiency of ring and PS training at 1..N ranks, with a cost model to 1024"
DEFAULT_SIZES = "4K,64K,1M,4M,16M"
DEFAULT_PREDICT = "8,16,32,64,128,256,512,1024"


def counts_argument(text: str) -> List[int]:
    return sorted({int(part) for part in text.split(",") if part.strip()})


def rank_counts(args) -> List[int]:
    """The rank counts to run: --counts, else 1, 2, 4, ... up to -n, and -n; 1 always
    (the baseline of every efficiency)."""
    counts = args.counts or [1 << k for k in range(args.ranks.bit_length()) if (1 << k) <= args.ranks]
    return sorted(set(counts) | {1} | ({args.ranks} if args.counts is None else set()))


class Launcher:
    """Starts one job per call and tells whether N ranks oversubscribe the cores."""

    def __init__(self, args):
        self.args = args
        self.extra = shlex.split(args.launcher_args)

    def plan(self, ranks: int, command: Sequence[str]) -> LaunchPlan:
        """srun spreads the ranks over the allocation's nodes (-N); mpirun fills each node's slots."""
        if self.args.launcher == "srun":
            spanned = min(ranks, int(os.environ.get("SLURM_JOB_NUM_NODES", "1")))
            spread = ["-N", str(spanned)] if spanned > 1 else []
            return LaunchPlan(["srun", *spread, "-n", str(ranks), *self.extra, *command])
        return build_mpirun(ranks, command, ft=self.args.ft, hostfile=self.args.hostfile,
                            extra_args=self.extra)

    def oversubscribed(self, ranks: int) -> bool:
        if self.args.launcher == "mpirun":
            return "--oversubscribe" in self.plan(ranks, ["true"]).argv
        slots = hostfile_slots(self.args.hostfile) if self.args.hostfile else None
        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
        return ranks > (slots or (os.cpu_count() or 1) * nodes)

    def run(self, ranks: int, command: Sequence[str], log: Path,
            env: Optional[Dict[str, str]] = None, accept: Sequence[int] = (0,)) -> None:
        """Run the job (with ``env`` added) with its output in ``log``; LaunchError naming
        it when it fails (an exit status not in ``accept``)."""
        plan = self.plan(ranks, command)
        with open(log, "w", encoding="utf-8") as out:
            out.write(f"$ {plan.shell()}\n")
            out.flush()
            job = run_job(plan.argv, timeout=self.args.timeout, env={**plan.env, **(env or {})}, output=out)
        if job.returncode not in accept:
            tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-15:])
            what = f"timed out after {self.args.timeout:g} s" if job.timed_out else f"exited {job.returncode}"
            raise LaunchError(f"{plan.shell()} {what}; its output ({log}) ends:\n{tail}")


def measured_row(result: Dict[str, Any], warmup: int) -> Dict[str, Any]:
    """Rates and bytes of one run's JSON: samples/s and seconds per step after the warm-up,
    and the median payload bytes a worker sent and received per step."""
    steps = result["steps"]
    walls = [row["wall_s"] for row in steps]
    examples = sum(row["examples"] for row in steps[warmup:])
    seconds = walls[-1] - (walls[warmup - 1] if warmup else 0.0)
    workers = range(result["servers"], result["ranks"])
    traffic = result["traffic"]
    sent = [s for rank in workers for s in traffic["bytes_sent"][rank][warmup:]]
    received = [r for rank in workers for r in traffic["bytes_received"][rank][warmup:]]
    return {"topology": result["mode"], "ranks": result["ranks"], "servers": result["servers"],
            "workers": result["ranks"] - result["servers"], "batch": result["config"]["batch"],
            "steps": len(steps), "samples_per_s": examples / max(seconds, 1e-12),
            "step_s": seconds / (len(steps) - warmup), "nodes": len(set(result["nodes"])),
            "bytes_sent_per_step": float(np.median(sent)) if sent else 0.0,
            "bytes_received_per_step": float(np.median(received)) if received else 0.0}


PHASE_KEYS = {("compute", "compute"): "gradient_s", ("compute", "apply"): "optimizer_s",
              ("communication", "reduce"): "communication_s", ("wait", "reduce"): "wait_s"}


def phase_seconds(timeline: Dict[str, Any], warmup: int) -> Dict[str, float]:
    """A ring run's seconds per step in each phase (gradient, optimizer, communication, wait),
    averaged over its ranks and the steps after the warm-up."""
    totals = dict.fromkeys(PHASE_KEYS.values(), 0.0)
    ranks, steps = set(), set()
    for event in timeline["traceEvents"]:
        key = PHASE_KEYS.get((event["name"], event.get("cat")))
        if event["ph"] == "X" and key and event["args"]["step"] > warmup:
            totals[key] += event["dur"] * 1e-6
            ranks.add(event["pid"])
            steps.add(event["args"]["step"])
    return {key: total / max(1, len(ranks) * len(steps)) for key, total in totals.items()}


def step_costs(rows: List[Dict[str, Any]], weak: bool) -> cost_model.StepCosts:
    """The cost model's inputs from the measurements: gradient time against workers and
    optimizer time (ring runs that do not oversubscribe), the ring's allreduced bytes, the
    PS bytes per worker."""
    ring = [row for row in rows if row["topology"] == "ring"]
    alone = [row for row in ring if not row["oversubscribed"]] or ring[:1]
    grad_fixed, grad_per_share = cost_model.fit_per_worker([row["ranks"] for row in alone],
                                                           [row["gradient_s"] for row in alone])
    largest = ring[-1]
    ring_bytes = (largest["bytes_sent_per_step"] / (2 * (largest["ranks"] - 1) / largest["ranks"])
                  if largest["ranks"] > 1 else 0.0)
    ps = [row for row in rows if row["topology"] == "ps"]
    fixed, per_share = cost_model.fit_per_worker(
        [row["workers"] for row in ps],
        [(row["bytes_sent_per_step"] + row["bytes_received_per_step"]) / 2 for row in ps])
    return cost_model.StepCosts(grad_fixed_s=grad_fixed, grad_per_share_s=grad_per_share,
                                apply_s=float(np.mean([row["optimizer_s"] for row in alone])),
                                batch=ring[0]["batch"], ring_bytes=ring_bytes or fixed + per_share,
                                ps_bytes_fixed=fixed, ps_bytes_per_share=per_share, weak=weak)


def fit_ranks(args, launcher: Launcher, counts: Sequence[int]) -> int:
    if args.fit_ranks:
        return max(2, args.fit_ranks)
    fitting = [n for n in counts if n >= 2 and not launcher.oversubscribed(n)]
    return max(fitting) if fitting else 2


def drive(args) -> int:
    """The whole benchmark, from the driver process; returns the exit status."""
    folder = Path(args.out)
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    launcher, counts = Launcher(args), rank_counts(args)
    hpcreduce = [sys.executable, "-m", "hpcreduce"]
    runs = [("ring", n) for n in counts] + [("ps", n) for n in counts if args.ps and n > args.servers]
    rows: List[Dict[str, Any]] = []
    per_worker = args.batch
    for topology, ranks in runs:
        stem = folder / "runs" / f"{topology}-{ranks}"
        command = [*hpcreduce, "train", "--mode", topology, "--model", args.model, "--steps", str(args.steps),
                   "--seed", str(args.seed), "--quiet", "--json", f"{stem}.json"]
        workers = ranks - args.servers if topology == "ps" else ranks
        batch = per_worker * workers if args.weak and per_worker else args.batch
        command += ["--batch", str(batch)] if batch else []
        command += ["--servers", str(args.servers)] if topology == "ps" else []
        command += ["--timeline", f"{stem}.timeline.json"] if topology == "ring" else []
        command += ["--device", args.device]
        print(f"hpcreduce bench scaling: {topology} on {ranks} rank{'s' * (ranks > 1)} ...", file=sys.stderr, flush=True)
        launcher.run(ranks, command, Path(f"{stem}.log"))
        result = json.loads(Path(f"{stem}.json").read_text())
        per_worker = per_worker or result["config"]["batch"]
        row = {**measured_row(result, args.warmup), "oversubscribed": launcher.oversubscribed(ranks)}
        if topology == "ring":
            row.update(phase_seconds(json.loads(Path(f"{stem}.timeline.json").read_text()), args.warmup))
        rows.append(row)
    single = rows[0]["samples_per_s"]
    for row in rows:
        row["speedup"] = row["samples_per_s"] / single
        row["efficiency"] = row["samples_per_s"] / (row["ranks"] * single)
    fit_n = fit_ranks(args, launcher, counts)
    bench_path = folder / "allreduce.json"
    print(f"hpcreduce bench scaling: allreduce and ping-pongs on {fit_n} ranks (alpha-beta fits) ...",
          file=sys.stderr, flush=True)
    launcher.run(fit_n, [*hpcreduce, "bench", "allreduce", "--sizes", ",".join(map(str, args.sizes)), "--links",
                         "--device", args.device, "--fusion-arrays", "4", "--fusion-elements", "1000",
                         "--json", str(bench_path)],
                 folder / "runs" / "allreduce.log")
    bench = json.loads(bench_path.read_text())
    ring_rows = [row for row in bench["rows"] if row["algorithm"] == "ring"]
    link = cost_model.fit_link([r["bytes"] for r in ring_rows], [r["median_s"] for r in ring_rows], bench["ranks"])
    costs = step_costs(rows, args.weak)
    result = assemble(args, rows, link, costs, bench)
    add_two_links(result, args, costs, bench)
    write_outputs(folder, result, bench, args.json_path)
    print(render(result), flush=True)
    return 0


def assemble(args, rows, link: cost_model.Link, costs: cost_model.StepCosts, bench) -> Dict[str, Any]:
    """The benchmark's JSON: measurements, the model's fit and inputs, its forecast beside
    the measurements, the forecast at --predict counts, the recommendation."""
    for row in rows:
        if row["topology"] == "ring":
            row["model_step_s"] = cost_model.ring_step_s(costs, link, row["ranks"])
        else:
            row["model_step_s"] = cost_model.ps_step_s(costs, link, row["ranks"], row["servers"])
    forecast = cost_model.predict(costs, link, args.predict)
    over = sorted({row["ranks"] for row in rows if row["oversubscribed"]})
    notes = []
    if over:
        notes.append(f"oversubscribed: runs on {', '.join(map(str, over))} ranks share {usable_cores()} cores; "
                     "their samples/s show this machine, not the method")
    return {"benchmark": NAME, "model": args.model, "device": args.device, "scaling": "weak" if args.weak else "strong",
            "steps": args.steps, "warmup": args.warmup, "launcher": args.launcher, "cores": usable_cores(),
            "oversubscribed_ranks": over, "notes": notes, "rows": rows,
            "link": {**asdict(link), "bandwidth_GBps": link.bandwidth_GBps, "fitted_from": bench["title"]},
            "costs": asdict(costs), "predictions": [p.as_dict() for p in forecast],
            "recommendation": cost_model.recommend(forecast, costs.ring_bytes)}


def fitted(links: Dict[str, Any], name: str) -> Optional[cost_model.Link]:
    """The ``name`` link (within, between) fitted to its one-way ping-pong times; None if the run had none."""
    return cost_model.fit_link(links["sizes"], links[name], 2, ring=False) if links[name] else None


def add_two_links(result: Dict[str, Any], args, costs: cost_model.StepCosts, bench: Dict[str, Any]) -> None:
    """To ``result``, the two-link model from the fit run's ping-pongs: each measured run beside its forecast
    (``two_link_step_s``: over the between-node link if its ranks span nodes, else within), the
    fit run's own ring allreduce times beside the ring's, and the flat ring, the hierarchical
    allreduce and the PS at ``--predict-nodes`` nodes."""
    links = bench["links"]
    within, between = fitted(links, "within"), fitted(links, "between")
    spanning = between if len(set(links["nodes"])) > 1 else within
    for row in result["rows"]:
        link = between if row["nodes"] > 1 else within
        if row["topology"] == "ring" and (row["ranks"] == 1 or link):
            row["two_link_step_s"] = cost_model.ring_step_s(costs, link, row["ranks"])
        elif row["topology"] == "ps" and link:
            row["two_link_step_s"] = cost_model.ps_step_s(costs, link, row["ranks"], row["servers"])
        else:
            row["two_link_step_s"] = None
    per_node, notes = links["ranks_per_node"], result["notes"]
    if between is None:
        notes.append("one node: no between-node link was measured, so no forecast by nodes")
    elif within is None and per_node > 1:
        notes.append("rank 0 was alone on its node: the node-local steps use the between-node link")
    forecast = cost_model.predict_nodes(costs, within or between, between, per_node, args.predict_nodes) \
        if between else []
    described = {name: {**asdict(link), "bandwidth_GBps": link.bandwidth_GBps} if link else None
                 for name, link in (("within", within), ("between", between))}
    allreduce = [{"bytes": row["bytes"], "measured_s": row["median_s"],
                  "model_s": cost_model.ring_s(row["bytes"], bench["ranks"], spanning)}
                 for row in bench["rows"] if row["algorithm"] == "ring"]
    result["links"] = {**described, "ranks_per_node": per_node, "nodes": links["nodes"], "sizes": links["sizes"],
                       "within_s": links["within"], "between_s": links["between"], "allreduce_vs_model": allreduce}
    result["node_predictions"] = forecast


def write_outputs(folder: Path, result: Dict[str, Any], bench: Dict[str, Any], json_path: Optional[str]) -> None:
    """scaling.json (and --json), the three CSV tables, and the three figures."""
    for path in {folder / "scaling.json", *([Path(json_path)] if json_path else [])}:
        write_json(str(path), result)
    tables = (("scaling.csv", result["rows"]), ("predictions.csv", result["predictions"]),
              ("node_predictions.csv", result["node_predictions"]))
    for name, table in tables:
        with atomic_file(str(folder / name)) as out:
            writer = csv.DictWriter(out, fieldnames=list(dict.fromkeys(key for row in table for key in row)))
            writer.writeheader()
            writer.writerows(table)
    from .. import plots
    plots.scaling_figure(result, folder / "scaling.png")
    plots.busbw_figure(bench, folder / "allreduce_busbw.png")
    plots.nodes_figure(result, folder / "nodes.png")


def render(result: Dict[str, Any]) -> str:
    """The console report: measured rows beside the model, the fit, the forecast, the advice."""
    link, costs = result["link"], result["costs"]
    lines = [f"scaling ({result['scaling']}), {result['model']} on {result['device']}, {result['steps']} steps "
             f"({result['warmup']} warm-up), {result['cores']} cores"
             + (f"  [OVERSUBSCRIBED at {', '.join(map(str, result['oversubscribed_ranks']))} ranks]"
                if result["oversubscribed_ranks"] else ""),
             f"{'topology':<8} {'ranks':>5} {'K':>2} {'W':>3} {'samples/s':>11} {'speedup':>8} "
             f"{'efficiency':>10} {'ms/step':>9} {'model ms':>9}"]
    for row in result["rows"]:
        lines.append(f"{row['topology']:<8} {row['ranks']:>5} {row['servers']:>2} {row['workers']:>3} "
                     f"{row['samples_per_s']:>11.0f} {row['speedup']:>7.2f}x {row['efficiency']:>10.2f} "
                     f"{row['step_s'] * 1e3:>9.2f} {row['model_step_s'] * 1e3:>9.2f}"
                     + ("  oversubscribed" if row["oversubscribed"] else ""))
    lines += [f"alpha-beta fit ({link['fitted_from']}): alpha {link['alpha_s'] * 1e6:.2f} us, "
              f"beta {link['beta_s_per_byte'] * 1e9:.4f} ns/B ({link['bandwidth_GBps']:.2f} GB/s), "
              f"rms error {link['rms_relative_error'] * 100:.0f}% over {link['points']} sizes",
              f"gradient per step {costs['grad_fixed_s'] * 1e3:.2f} ms + {costs['grad_per_share_s'] * 1e3:.2f} ms/W, "
              f"optimizer {costs['apply_s'] * 1e3:.2f} ms; "
              f"ring allreduces {costs['ring_bytes'] / 2**20:.3g} MiB, a PS worker moves "
              f"{costs['ps_bytes_fixed'] / 2**10:.4g} KiB + {costs['ps_bytes_per_share'] / 2**10:.4g} KiB/W each way",
              "forecast (cost model):",
              f"{'ranks':>6} {'ring ms':>9} {'ring eff':>8} {'PS K':>5} {'PS ms':>9} {'PS eff':>7} {'PS K=1 ms':>10}  faster"]
    for p in result["predictions"]:
        lines.append(f"{p['ranks']:>6} {p['ring_step_s'] * 1e3:>9.3f} {p['ring_efficiency']:>8.2f} "
                     f"{p['ps_servers']:>5} {p['ps_step_s'] * 1e3:>9.3f} {p['ps_efficiency']:>7.2f} "
                     f"{p['ps1_step_s'] * 1e3:>10.3f}  {p['winner']}")
    return "\n".join(lines + render_two_links(result) + result["notes"] + [result["recommendation"]])


def render_two_links(result: Dict[str, Any]) -> List[str]:
    """The two links' fits, each run beside its two-link forecast, and the forecast by nodes."""
    links = result["links"]
    lines = [f"two links (ping-pong, fit run on {nodes.describe(links['nodes'])}):"]
    for name in ("within", "between"):
        link = links[name]
        lines.append(f"  {name} nodes: " + ("not in this run" if link is None else
                     f"alpha {link['alpha_s'] * 1e6:.1f} us, beta {link['beta_s_per_byte'] * 1e9:.4f} ns/B "
                     f"({link['bandwidth_GBps']:.2f} GB/s), rms error {link['rms_relative_error'] * 100:.0f}%"))
    for row in result["rows"]:
        model = row["two_link_step_s"]
        where = f"{row['nodes']} node{'s' * (row['nodes'] > 1)}"
        lines.append(f"  {row['topology']:<5} {row['ranks']:>3} ranks on {where}: measured "
                     f"{row['step_s'] * 1e3:.2f} ms/step, two-link model "
                     + ("-" if model is None else f"{model * 1e3:.2f} ms"))
    cells = ", ".join(f"{row['bytes']} B {row['measured_s'] * 1e3:.3g} vs {row['model_s'] * 1e3:.3g} ms"
                      for row in links["allreduce_vs_model"])
    lines.append(f"  the fit run's ring allreduce, measured vs two-link model: {cells}")
    if result["node_predictions"]:
        lines.append(f"forecast by nodes ({links['ranks_per_node']} ranks per node), ms per step:")
        lines.append(f"{'nodes':>6} {'ranks':>6} {'ring':>10} {'hierarchical':>13} {'PS':>10} {'PS K':>5}  fastest")
        for p in result["node_predictions"]:
            lines.append(f"{p['nodes']:>6} {p['ranks']:>6} {p['ring_step_s'] * 1e3:>10.3f} "
                         f"{p['hierarchical_step_s'] * 1e3:>13.3f} {p['ps_step_s'] * 1e3:>10.3f} "
                         f"{p['ps_servers']:>5}  {p['fastest']}")
    return lines
