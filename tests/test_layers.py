"""The package's architecture, as tests: the import rules, what a layer loads, file sizes.

The layers and the forbidden imports are import-linter contracts in ``.importlinter``
(function-local imports count); a change that breaks one fails here.
"""
import subprocess
import sys
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hpcreduce"
LONGEST = 420  # lines: modules stay small, with one job each


def test_every_import_contract_is_kept(capsys):
    status = lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert status == 0, report
    assert "3 kept, 0 broken" in report, report


@pytest.mark.parametrize("module, allowed", [
    ("hpcreduce.ps", {"ps", "runtime", "arrays", "errors"}),
    ("hpcreduce.ft.rounds", {"ft", "runtime", "arrays", "errors"}),
    ("hpcreduce.collectives", {"collectives", "runtime", "arrays", "errors"}),
    ("hpcreduce.runtime.context", {"runtime", "arrays", "errors"}),
])
def test_importing_a_layer_loads_only_what_it_may_use(module, allowed):
    probe = (f"import sys, {module}; "
             "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('hpcreduce.')}))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    assert set(eval(loaded.stdout)) <= allowed, loaded.stdout


def test_no_module_is_over_the_size_limit():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert len(sizes) > 50, sizes
    assert not {path: lines for path, lines in sizes.items() if lines > LONGEST}
