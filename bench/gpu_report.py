"""bench/gpu_check.sh's helper: what the machine has, and the check's report.

    python bench/gpu_report.py facts FACTS.json       # python, cupy, GPU, NCCL, MPI (one process)
    python bench/gpu_report.py summary WORK OUT       # OUT/gpu_results.json and OUT/gpu_summary.md

``facts`` never fails: what it cannot find it records as an error string. ``summary``
reads WORK/steps.tsv, WORK/facts.json, WORK/pytest.xml, WORK/train_*.json, WORK/scaling.json
and OUT/bench_gpu_n*.json, whichever exist, so it reports whatever the check got to.
"""
from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Dict, List


def facts(path: str) -> None:
    found: Dict[str, object] = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        import cupy
        runtime = cupy.cuda.runtime
        found["cupy"] = cupy.__version__
        found["gpus"] = runtime.getDeviceCount()
        name = runtime.getDeviceProperties(0)["name"]
        found["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        found["cuda_driver"] = runtime.driverGetVersion()
        found["cuda_runtime"] = runtime.runtimeGetVersion()
    except Exception as err:  # no cupy, no driver, no GPU: recorded, not fatal
        found["cupy_error"] = f"{type(err).__name__}: {err}"
    try:
        from cupy.cuda import nccl
        found["nccl"] = nccl.get_version() if nccl.available else "not available"
    except Exception as err:
        found["nccl"] = f"{type(err).__name__}: {err}"
    try:
        import mpi4py
        from mpi4py import MPI

        from hpcreduce.runtime import environment
        found["mpi4py"] = mpi4py.__version__
        found["mpi_library"] = MPI.Get_library_version().strip().strip("\x00").splitlines()[0]
        found["mpi_cuda_aware"] = environment.cuda_aware(MPI, env={})
    except Exception as err:
        found["mpi_error"] = f"{type(err).__name__}: {err}"
    Path(path).write_text(json.dumps(found, indent=1))
    print(json.dumps(found, indent=1))


def read_steps(work: Path) -> List[Dict[str, str]]:
    steps = []
    table = work / "steps.tsv"
    if table.exists():
        for line in table.read_text().splitlines():
            name, status, seconds, detail = (line.split("\t") + ["", "", ""])[:4]
            steps.append({"step": name, "status": status, "seconds": seconds, "detail": detail})
    return steps


def read_tests(work: Path) -> Dict[str, object]:
    report = work / "pytest.xml"
    if not report.exists():
        return {}
    root = ElementTree.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = []
    for case in suite.iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome, detail = tag, (element.get("message") or "")[:300]
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time", 0)), "detail": detail})
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return {**counts, "cases": cases}


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def bench_table(result: Dict[str, object]) -> List[str]:
    names, peer = result["candidates"], result["peer"]
    lines = [f"### {result['title']}", "",
             "| size | " + " | ".join(f"{name} busbw GB/s (vs {peer})" for name in names) + " |",
             "|---" * (len(names) + 1) + "|"]
    by_size: Dict[int, Dict[str, dict]] = {}
    for row in result["rows"]:
        by_size.setdefault(row["bytes"], {})[row["algorithm"]] = row
    for nbytes, rows in by_size.items():
        cells = [f"{rows[n]['busbw_GBps']:.3f} ({rows[n]['busbw_vs_' + peer]:.2f}x)"
                 + ("" if rows[n].get("agrees_with_native", True) else " WRONG") for n in names]
        lines.append(f"| {size_text(nbytes)} | " + " | ".join(cells) + " |")
    fusion = result["fusion"]
    lines += [""] + [f"- {note}" for note in result.get("notes", [])] + [
        f"- fusion, {fusion['arrays']} x {fusion['elements']} float32: allreduce_many "
        f"{fusion['allreduce_many'] * 1e3:.3f} ms against {fusion['native_per_array'] * 1e3:.3f} ms "
        f"for one native call per array ({fusion['speedup']:.2f}x)", ""]
    return lines


def read_json(path: Path) -> Dict[str, object]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {"error": f"unreadable: {err}"}


def train_table(runs: Dict[str, Dict[str, object]]) -> List[str]:
    """Each `train` run: mode, device, ranks, examples/s over its training time, held-out result."""
    lines = ["| run | mode | device | ranks | steps | train s | examples/s | loss | accuracy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        if "final" not in run:
            lines.append(f"| {name} | {run.get('error')} |")
            continue
        config = run["config"]
        examples = config["batch"] * len(run["steps"])  # the global batch of every step
        lines.append(f"| {name} | {config['mode']} | {config.get('device', 'cpu')} | {run['ranks']} | "
                     f"{len(run['steps'])} | {run['train_s']:.2f} | {examples / max(run['train_s'], 1e-9):.0f} | "
                     f"{run['final']['loss']:.4f} | {run['final']['accuracy']:.4f} |")
    return lines + [""]


def scaling_lines(result: Dict[str, object]) -> List[str]:
    """The GPU scaling runs and the alpha-beta fit of the GPU's own ring allreduce."""
    if "rows" not in result:
        return [f"- {result.get('error')}", ""]
    link = result["link"]
    lines = [f"alpha-beta fit ({link['fitted_from']}): alpha {link['alpha_s'] * 1e6:.1f} us, "
             f"bandwidth {link['bandwidth_GBps']:.2f} GB/s", "",
             "| topology | ranks | samples/s | efficiency | ms/step | model ms/step |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['topology']} | {r['ranks']} | {r['samples_per_s']:.0f} | {r['efficiency']:.2f} | "
              f"{r['step_s'] * 1e3:.2f} | {r['model_step_s'] * 1e3:.2f} |" for r in result["rows"]]
    return lines + ["", f"- {result.get('recommendation', '')}", ""]


def summary(work_dir: str, out_dir: str) -> None:
    work, out = Path(work_dir), Path(out_dir)
    machine = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    steps, tests = read_steps(work), read_tests(work)
    benches = {}
    for path in sorted(out.glob("bench_gpu_n*.json")):
        try:
            benches[path.stem] = json.loads(path.read_text())
        except ValueError as err:
            benches[path.stem] = {"error": f"unreadable: {err}"}
    bad = [s["step"] for s in steps if s["status"] not in ("ok",)]
    status = ("no GPU" if (work / "no_gpu").exists() else
              "failed: " + ", ".join(bad) if bad else "ok")
    results = {"status": status, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine,
               "mpi_source": (work / "mpi_source").read_text().strip() if (work / "mpi_source").exists() else None,
               "steps": steps, "tests": tests, "benchmarks": benches,
               "train": {path.stem: read_json(path) for path in sorted(work.glob("train_*.json"))},
               "scaling": read_json(work / "scaling.json") if (work / "scaling.json").exists() else None}
    (out / "gpu_results.json").write_text(json.dumps(results, indent=1))
    lines = [f"# hpcreduce GPU check: {status}", "", f"finished {results['finished']}", "",
             "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in machine.items()]
    lines += [f"| MPI from | {results['mpi_source']} |", "", "## Steps", "",
              "| step | status | seconds | detail |", "|---|---|---|---|"]
    lines += [f"| {s['step']} | {s['status']} | {s['seconds']} | {s['detail']} |" for s in steps]
    if tests:
        lines += ["", f"## Tests: {tests['tests']} run, {tests['failures'] + tests['errors']} failed, "
                      f"{tests['skipped']} skipped", ""]
        lines += [f"- {c['outcome']} {c['test']} ({c['seconds']:.1f} s) {c['detail']}" for c in tests["cases"]]
    if results["train"]:
        lines += ["", "## hpcreduce train", ""] + train_table(results["train"])
    lines += ["", "## allreduce on the GPU", ""]
    for name, result in benches.items():
        lines += bench_table(result) if "rows" in result else [f"- {name}: {result.get('error')}", ""]
    if results["scaling"]:
        lines += ["## bench scaling --device gpu", ""] + scaling_lines(results["scaling"])
    text = "\n".join(lines) + "\n"
    (out / "gpu_summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "facts":
        facts(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "summary":
        summary(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
