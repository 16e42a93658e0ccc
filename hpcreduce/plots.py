"""PNG figures of results, drawn with matplotlib's Agg backend (``pip install 'hpcreduce[plot]'``).

- ``training_figures``: a ``hpcreduce train --json`` result: loss.png (train loss per
  step, held-out loss at the end), throughput.png (samples/s per step), staleness.png
  (PS read staleness and update lag histograms; ring mode: all at 0).
- ``busbw_figure``: a ``hpcreduce bench allreduce`` result: busbw against message size.
- ``scaling_figure``: a ``hpcreduce bench scaling`` result: measured samples/s and
  efficiency against ranks, and the cost model's time per step up to 1024 ranks.
- ``nodes_figure``: the same result's runs, measured against the two-link model, and its
  forecast by nodes (flat ring, hierarchical allreduce, PS).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping

import numpy as np

from .errors import PlottingUnavailableError
from .runtime.files import atomic_file

COLORS = {"ring": "tab:blue", "ps": "tab:orange"}


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    try:
        import matplotlib
    except ImportError:
        raise PlottingUnavailableError("drawing PNGs needs matplotlib: pip install 'hpcreduce[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(figure, path: Path) -> Path:
    """``figure`` as a PNG at ``path``, replaced whole like every output (``OutputFileError`` naming it)."""
    figure.tight_layout()
    try:
        with atomic_file(str(path), "wb") as out:
            figure.savefig(out, dpi=100, format="png")
    finally:
        pyplot().close(figure)
    return path


def step_rates(steps: List[Mapping[str, Any]]) -> np.ndarray:
    """samples/s of each step: its examples over the wall time since the previous step."""
    walls = np.array([0.0] + [row["wall_s"] for row in steps])
    examples = np.array([row["examples"] for row in steps], dtype=np.float64)
    return examples / np.maximum(np.diff(walls), 1e-12)


def training_figures(result: Mapping[str, Any], folder: Path) -> List[Path]:
    """loss.png, throughput.png and staleness.png of one training result in ``folder``."""
    plt = pyplot()
    steps = result["steps"]
    numbers = [row["step"] for row in steps]
    title = (f"{result['model']}, {result['mode']} on {result['ranks']} ranks "
             f"({result['workers']} workers)")
    written = []

    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(numbers, [row["loss"] for row in steps], label="train loss (global batch)")
    axes.axhline(result["final"]["loss"], color="tab:red", linestyle="--",
                 label=f"held-out loss at the end: {result['final']['loss']:.4f}")
    axes.set(xlabel="step", ylabel="loss", title=title)
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.legend()
    written.append(save(figure, folder / "loss.png"))

    figure, axes = plt.subplots(figsize=(7, 4))
    rates = step_rates(steps)
    axes.plot(numbers, rates, linewidth=0.8, label="per step")
    axes.axhline(result["samples_per_s"], color="tab:green", linestyle="--",
                 label=f"whole run: {result['samples_per_s']:.0f} samples/s")
    axes.set(xlabel="step", ylabel="samples/s", title=title)
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.legend()
    written.append(save(figure, folder / "throughput.png"))

    figure, panels = plt.subplots(1, 2, figsize=(9, 4))
    staleness = result["staleness"]
    for axes, key, label in ((panels[0], "read_hist", "read staleness (clocks behind)"),
                             (panels[1], "lag_hist", "update lag (updates since the read)")):
        counts = staleness.get(key) or [0]
        axes.bar(range(len(counts)), counts, color=COLORS.get(result["mode"], "tab:gray"))
        axes.set(xlabel=label, ylabel="count")
        axes.set_xticks(range(len(counts)))
    figure.suptitle(f"{title}: staleness (max read {staleness.get('read_max', 0)})")
    written.append(save(figure, folder / "staleness.png"))
    return written


def busbw_figure(bench: Mapping[str, Any], path: Path) -> Path:
    """busbw (GB/s) against message size, one line per algorithm of an allreduce benchmark."""
    plt = pyplot()
    by_algorithm: Dict[str, List[tuple]] = {}
    for row in bench["rows"]:
        by_algorithm.setdefault(row["algorithm"], []).append((row["bytes"], row["busbw_GBps"]))
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, points in by_algorithm.items():
        sizes, busbw = zip(*sorted(points))
        axes.plot(sizes, busbw, marker="o", label=name)
    axes.set_xscale("log", base=2)
    axes.set(xlabel="message size (bytes)", ylabel="busbw (GB/s)", title=bench.get("title", "allreduce"))
    axes.legend()
    return save(figure, path)


def scaling_figure(result: Mapping[str, Any], path: Path) -> Path:
    """Three panels: measured samples/s (with the linear ideal) and efficiency against ranks,
    and time per step, measured and forecast by the cost model, up to the largest forecast."""
    plt = pyplot()
    figure, (rate_axes, efficiency_axes, model_axes) = plt.subplots(1, 3, figsize=(15, 4.5))
    rows, single = result["rows"], result["rows"][0]["samples_per_s"]
    for topology in ("ring", "ps"):
        mine = [row for row in rows if row["topology"] == topology]
        if topology == "ps" and not mine:
            continue
        ranks = [row["ranks"] for row in mine]
        label = "ring" if topology == "ring" else f"PS (K={mine[0]['servers']})"
        color = COLORS[topology]
        rate_axes.plot(ranks, [row["samples_per_s"] for row in mine], marker="o", color=color, label=label)
        efficiency_axes.plot(ranks, [row["efficiency"] for row in mine], marker="o", color=color, label=label)
        model_axes.plot(ranks, [row["step_s"] * 1e3 for row in mine], "o", color=color, label=f"{label} measured")
        model_axes.plot(ranks, [row["model_step_s"] * 1e3 for row in mine], "x", color=color,
                        label=f"{label} model")
    top = max(row["ranks"] for row in rows)
    rate_axes.plot([1, top], [single, single * top], "k:", label="linear")
    rate_axes.set(xlabel="ranks", ylabel="samples/s", title="throughput")
    efficiency_axes.axhline(1.0, color="k", linestyle=":")
    efficiency_axes.set(xlabel="ranks", ylabel="samples/s / (N x one rank's)", title="parallel efficiency",
                        ylim=(0, max(1.1, max(row["efficiency"] for row in rows) * 1.1)))
    forecast = result["predictions"]
    if forecast:
        ranks = [p["ranks"] for p in forecast]
        model_axes.plot(ranks, [p["ring_step_s"] * 1e3 for p in forecast], "-", color=COLORS["ring"],
                        label="ring forecast")
        model_axes.plot(ranks, [p["ps_step_s"] * 1e3 for p in forecast], "-", color=COLORS["ps"],
                        label="PS forecast (best K)")
        model_axes.plot(ranks, [p["ps1_step_s"] * 1e3 for p in forecast], "--", color=COLORS["ps"],
                        label="PS forecast (K=1)")
    model_axes.set_xscale("log", base=2)
    model_axes.set_yscale("log")
    model_axes.set(xlabel="ranks", ylabel="ms per step", title="alpha-beta cost model")
    for axes in (rate_axes, efficiency_axes, model_axes):
        axes.legend(fontsize="small")
    over = result["oversubscribed_ranks"]
    figure.suptitle(f"{result['model']}, {result['scaling']} scaling, {result['cores']} cores"
                    + (f" - OVERSUBSCRIBED at {', '.join(map(str, over))} ranks" if over else ""))
    return save(figure, path)


def nodes_figure(result: Mapping[str, Any], path: Path) -> Path:
    """Three panels: each run's measured ms per step beside the two-link model's, the fit run's
    ring allreduce against the model, and the forecast ms per step by nodes of the flat ring,
    the hierarchical allreduce and the PS."""
    plt = pyplot()
    figure, (runs_axes, allreduce_axes, nodes_axes) = plt.subplots(1, 3, figsize=(17, 4.5))
    rows = result["rows"]
    labels = [f"{row['topology']} {row['ranks']}\n{row['nodes']} node{'s' * (row['nodes'] > 1)}" for row in rows]
    at = np.arange(len(rows))
    runs_axes.bar(at - 0.2, [row["step_s"] * 1e3 for row in rows], 0.4, label="measured")
    runs_axes.bar(at + 0.2, [(row["two_link_step_s"] or 0.0) * 1e3 for row in rows], 0.4, label="two-link model")
    runs_axes.set_xticks(at)
    runs_axes.set_xticklabels(labels, fontsize="small")
    runs_axes.set(ylabel="ms per step", title="the runs: measured against predicted")
    runs_axes.legend(fontsize="small")
    points = result["links"]["allreduce_vs_model"]
    for key, style, label in (("measured_s", "o", "measured"), ("model_s", "-", "two-link model")):
        allreduce_axes.loglog([p["bytes"] for p in points], [p[key] * 1e3 for p in points], style, label=label)
    allreduce_axes.set(xlabel="bytes", ylabel="ms",
                       title=f"the fit run's ring allreduce ({len(result['links']['nodes'])} ranks)")
    allreduce_axes.legend(fontsize="small")
    forecast = result["node_predictions"]
    for key, label in (("ring", "flat ring"), ("hierarchical", "hierarchical (modelled)"), ("ps", "PS (best K)")):
        nodes_axes.plot([p["nodes"] for p in forecast], [p[f"{key}_step_s"] * 1e3 for p in forecast], "o-",
                        label=label)
    nodes_axes.set(xlabel="nodes", ylabel="ms per step (forecast)",
                   title=f"{result['links']['ranks_per_node']} ranks per node" if forecast else
                   "no forecast: one node, no between-node link")
    if forecast:
        nodes_axes.set_xscale("log", base=2)
        nodes_axes.set_yscale("log")
        nodes_axes.legend(fontsize="small")
    over = result["oversubscribed_ranks"]
    figure.suptitle(f"{result['model']}, two-link cost model, {result['cores']} cores"
                    + (f" - OVERSUBSCRIBED at {', '.join(map(str, over))} ranks" if over else ""))
    return save(figure, path)
