"""The house's shape in figures (issue 48): lines per package, modules importing more than 15 of
the package's modules, import circles, and the counts of capabilities built more than once.

    python bench/house_metrics.py [--json]

Imports are read by grimp (import-linter's graph), function-local ones included, as the layer
contract counts them. The counts are plain text searches of ``hpcreduce/``; each names what it
looks for, so a figure can be checked by hand.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List

import grimp

ROOT = Path(__file__).resolve().parent.parent / "hpcreduce"
IMPORT_LIMIT = 15
sys.path.insert(0, str(ROOT.parent))  # grimp reads the package of this checkout, not an installed one

BUFFER_COLLECTIVES = re.compile(r"\.I?(Allreduce|Allgatherv?|Alltoallv?|Reduce_scatter(_block)?|Bcast|Reduce|"
                                r"Gatherv?|Scatterv?|Exscan|Scan)\(")
AGREEMENT = re.compile(r"\.allgather\(\s*(problem|refus|failure|verdict|reason)")
DTYPE_NAME = re.compile(r"\b(b?float16|float32|float64|int32|int64)\b")
"""A line naming two or more dtypes in a literal (a tuple, a set, choices): an independent dtype table."""
CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*\s*[:=]")
FINITE_RULE = re.compile(r"^def \w*finite\w*\(|^def finish_sum")
"""A module-level function deciding NaN/Inf: one finite rule (options' bounds on one number left out)."""
INLINE_FINITE = re.compile(r"(np|torch|xp|cupy)\.isfinite\(\s*(?!self\.init_scale|lr\b)")
"""An array's NaN/Inf check written inline, beside the rules."""
FINITE_MODULES = ("arrays/finite.py", "torch/finite.py")


def lines_per_package() -> Dict[str, int]:
    """Lines of each top-level package (a module at the top counts as its own)."""
    lines: Counter = Counter()
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        lines[parts[0] if len(parts) > 1 else parts[0][:-3]] += len(path.read_text().splitlines())
    return dict(sorted(lines.items(), key=lambda item: -item[1]))


def heavy_importers(graph) -> Dict[str, int]:
    """Modules directly importing more than IMPORT_LIMIT of the package's modules."""
    counts = {module: len(graph.find_modules_directly_imported_by(module) - {module})
              for module in graph.modules if module.startswith("hpcreduce")}
    return dict(sorted(((m, n) for m, n in counts.items() if n > IMPORT_LIMIT), key=lambda item: -item[1]))


def circles(graph) -> List[List[str]]:
    """Strongly connected groups of two or more modules (Tarjan), a package's ``__init__`` left out
    (it imports its modules to re-export them; a module importing its own package is no circle)."""
    modules = sorted(m for m in graph.modules if m.startswith("hpcreduce") and not graph.find_children(m))
    edges = {m: sorted(n for n in graph.find_modules_directly_imported_by(m) if n in modules) for m in modules}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for module in modules:
        if module not in index:
            visit(module)
    return found


def grep(pattern: re.Pattern, skip: str = "") -> List[str]:
    """``path:line`` of each match in hpcreduce/ (files under ``skip`` left out)."""
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if skip and name.startswith(skip):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{name}:{number}")
    return hits


def dtype_tables() -> List[str]:
    """``path:line`` of each module-level constant (its whole statement) or ``choices=`` naming two or
    more dtypes: a table of which dtypes travel, reduce or are accepted."""
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if CONSTANT.match(line):
                text, end = line, number
                while text.count("(") + text.count("[") > text.count(")") + text.count("]") and end < len(lines):
                    text, end = text + lines[end], end + 1
            elif "choices=" in line:
                text = line
            else:
                continue
            if len(set(DTYPE_NAME.findall(text.split("#")[0]))) >= 2:
                hits.append(f"{name}:{number}")
    return hits


def metrics() -> dict:
    graph = grimp.build_graph("hpcreduce", cache_dir=None)
    dynamic = grep(re.compile(r"\.dynamic\b"))
    return {
        "lines": lines_per_package(),
        "lines_total": sum(len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")),
        "over_import_limit": heavy_importers(graph),
        "circles": circles(graph),
        "dynamic_tests": {"count": len(dynamic), "files": len({hit.split(":")[0] for hit in dynamic})},
        "buffer_collectives_outside": grep(BUFFER_COLLECTIVES, skip="collectives/"),
        "allgather_agreements": grep(AGREEMENT, skip="collectives/"),
        "dtype_tables": dtype_tables(),
        "finite_rules": grep(FINITE_RULE, skip="runtime/options.py"),
        "inline_finite_checks": [hit for hit in grep(INLINE_FINITE) if not hit.endswith(FINITE_MODULES, 0, hit.index(":"))],
    }


def main() -> None:
    found = metrics()
    if "--json" in sys.argv:
        print(json.dumps(found, indent=1))
        return
    print(f"lines: {found['lines_total']}  " + "  ".join(f"{k} {v}" for k, v in found["lines"].items()))
    print(f"modules importing > {IMPORT_LIMIT}: {len(found['over_import_limit'])}")
    for module, count in found["over_import_limit"].items():
        print(f"    {count:3d} {module}")
    print(f"import circles: {len(found['circles'])} "
          f"({sum(len(c) == 2 for c in found['circles'])} of two files)")
    for group in found["circles"]:
        print("    " + " + ".join(group))
    print(f".dynamic tests: {found['dynamic_tests']['count']} in {found['dynamic_tests']['files']} files")
    for key in ("buffer_collectives_outside", "allgather_agreements", "dtype_tables", "finite_rules",
                "inline_finite_checks"):
        hits = found[key]
        print(f"{key}: {len(hits)} in {len({h.split(':')[0] for h in hits})} files"
              + ("\n    " + "\n    ".join(hits) if hits else ""))


if __name__ == "__main__":
    main()
