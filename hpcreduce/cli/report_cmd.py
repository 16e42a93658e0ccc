"""``hpcreduce report FILE.json [--out DIR]``: draw a result as PNG figures (needs matplotlib).

What is drawn depends on the file:

- ``hpcreduce train --json``: loss.png, throughput.png, staleness.png;
- ``hpcreduce bench allreduce --json``: allreduce_busbw.png (busbw against message size);
- ``hpcreduce bench scaling`` (scaling.json): scaling.png, and nodes.png (the two-link model).

``--out`` defaults to ``<file name without .json>-report`` beside the file; a folder that
cannot be one (a file in the way) or that is FILE.json, or inside a folder named by it, is refused
before anything is drawn (exit 2); figures already there are replaced, as every output is. Runs
on one process, no MPI job.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, List, Mapping

from ..errors import UnknownResultError
from ..runtime.places import Place, place_problems
from .checks import refuse


def register(subcommands) -> None:
    parser = subcommands.add_parser("report", help="draw a train or bench result as PNG figures",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", metavar="FILE.json", help="a train --json, bench allreduce or scaling result")
    parser.add_argument("--out", metavar="DIR", help="folder for the PNGs (default FILE-report beside the file)")
    parser.set_defaults(run=run)


# What each kind of result needs at its top level (what its figures read).
NEEDS = {
    "train": ("steps", "final", "model", "mode", "ranks", "workers", "samples_per_s", "staleness"),
    "allreduce": ("rows",),
    "scaling": ("rows", "model", "scaling", "cores", "predictions", "oversubscribed_ranks"),
}


def kind_of(result: Mapping[str, Any]) -> str:
    """``train``, ``allreduce`` or ``scaling``; UnknownResultError for anything else."""
    benchmark = result.get("benchmark")
    if benchmark in ("allreduce", "scaling"):
        return benchmark
    if benchmark is None and "steps" in result and "final" in result:
        return "train"
    raise UnknownResultError("not a result of hpcreduce train --json, bench allreduce or bench scaling "
                             f"(keys: {', '.join(sorted(result)) or 'none'})")


def draw(result: Mapping[str, Any], folder: Path) -> List[Path]:
    """The figures of ``result`` in ``folder``; UnknownResultError, naming what is missing or
    malformed, for anything else (checked before anything is drawn where it can be)."""
    from .. import plots
    kind = kind_of(result)
    missing = [key for key in NEEDS[kind] if key not in result]
    if missing:
        raise UnknownResultError(f"a {kind} result needs {', '.join(NEEDS[kind])}; this one lacks "
                                 f"{', '.join(missing)}")
    try:
        if kind == "allreduce":
            return [plots.busbw_figure(result, folder / "allreduce_busbw.png")]
        if kind == "scaling":  # nodes.png too where the result has the two links (not before issue 15)
            return [plots.scaling_figure(result, folder / "scaling.png"),
                    *([plots.nodes_figure(result, folder / "nodes.png")] if "links" in result else [])]
        return plots.training_figures(result, folder)
    except KeyError as err:
        raise UnknownResultError(f"a {kind} result whose entries lack {err}") from None
    except (TypeError, ValueError, IndexError) as err:
        raise UnknownResultError(f"a {kind} result with a malformed entry ({err})") from None


def run(args: argparse.Namespace, _argv) -> int:
    source = Path(args.result)
    try:
        result = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UnknownResultError(f"cannot read {source}: {err}") from None
    if not isinstance(result, dict):
        raise UnknownResultError(f"{source} holds a JSON {type(result).__name__}, not a result object")
    folder = Path(args.out) if args.out else source.with_name(f"{source.stem}-report")
    problems = place_problems([Place("FILE", str(source), output=False), Place("--out", str(folder), folder=True)])
    if problems:
        return refuse("report", problems)
    for path in draw(result, folder):
        print(f"wrote {path}", file=sys.stderr)
    return 0
