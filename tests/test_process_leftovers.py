"""What hpcreduce leaves a process with: its exit code and atexit handlers under ULFM, the signal
handlers it had before ``elastic.run(on_stop=...)``, and an environment ``import hpcreduce`` does
not touch outside a rank."""
import json
import os
import subprocess
import sys

from mpi_run import mpirun


def test_an_armed_ulfm_exit_keeps_the_scripts_exit_code_and_runs_its_atexit_handlers(tmp_path):
    result = mpirun(2, "ulfm_exit_code.py", str(tmp_path), ft=True, timeout=90)
    assert result.returncode == 3, result
    assert sorted(os.listdir(tmp_path)) == ["handler-0", "handler-1"], result


def test_elastic_run_with_on_stop_gives_the_signals_their_handlers_back():
    result = mpirun(2, "elastic_stop_handlers.py", ft=True, timeout=90)
    assert result.returncode == 0 and result.output.count("ok handlers restored") == 2, result


def test_import_hpcreduce_leaves_a_process_that_is_no_rank_its_environment():
    script = ("import json, os; before = dict(os.environ); import hpcreduce; "
              "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stdout + done.stderr
