"""``hpcreduce report FILE.json [--out DIR]``: draw a result as PNG figures (needs matplotlib).

What is drawn depends on the file:

- ``hpcreduce train --json``: loss.png, throughput.png, staleness.png;
- ``hpcreduce bench allreduce --json``: allreduce_busbw.png (busbw against message size);
- ``hpcreduce bench scaling`` (scaling.json): scaling.png.

``--out`` defaults to ``<file name without .json>-report`` beside the file. Runs on
one process, no MPI job.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, List, Mapping

from ..errors import UnknownResultError


def register(subcommands) -> None:
    parser = subcommands.add_parser("report", help="draw a train or bench result as PNG figures",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", metavar="FILE.json", help="a train --json, bench allreduce or scaling result")
    parser.add_argument("--out", metavar="DIR", help="folder for the PNGs (default FILE-report beside the file)")
    parser.set_defaults(run=run)


def draw(result: Mapping[str, Any], folder: Path) -> List[Path]:
    """The figures of ``result`` in ``folder``; UnknownResultError for anything else."""
    from .. import plots
    benchmark = result.get("benchmark")
    if benchmark == "allreduce":
        return [plots.busbw_figure(result, folder / "allreduce_busbw.png")]
    if benchmark == "scaling":
        return [plots.scaling_figure(result, folder / "scaling.png")]
    if "steps" in result and "final" in result:
        return plots.training_figures(result, folder)
    raise UnknownResultError("not a result of hpcreduce train --json, bench allreduce or bench scaling "
                             f"(keys: {', '.join(sorted(result)) or 'none'})")


def run(args: argparse.Namespace, _argv) -> int:
    source = Path(args.result)
    try:
        result = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UnknownResultError(f"cannot read {source}: {err}") from None
    if not isinstance(result, dict):
        raise UnknownResultError(f"{source} holds a JSON {type(result).__name__}, not a result object")
    folder = Path(args.out) if args.out else source.with_name(f"{source.stem}-report")
    for path in draw(result, folder):
        print(f"wrote {path}", file=sys.stderr)
    return 0
