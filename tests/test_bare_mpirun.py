"""A user's own launcher: a bare ``mpirun`` of a script that imports hpcreduce, without the
settings ``hpcreduce launch`` adds; hpcreduce sets what this environment's Open MPI needs
before MPI starts (no UCX one-sided component, no libfabric byte transport; one job, 2 ranks)."""
import os
import subprocess
import sys

from hpcreduce.runtime.environment import BUNDLED_MPI_ENV, bundled_open_mpi
from hpcreduce.runtime.launch import build_mpirun

SCRIPT = """
import os
import hpcreduce
from mpi4py import MPI
window = MPI.Win.Allocate_shared(8, 1, comm=hpcreduce.init().comm)  # osc's components are chosen here
window.Free()
print("set:", *(os.environ.get(name) for name in ("OMPI_MCA_osc", "OMPI_MCA_btl")), flush=True)
"""


def test_a_bare_mpirun_of_a_script_that_imports_hpcreduce_prints_no_mpi_errors():
    plan = build_mpirun(2, [sys.executable, "-c", SCRIPT])
    env = {name: value for name, value in {**os.environ, **plan.env}.items() if name not in BUNDLED_MPI_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    job = subprocess.run(plan.argv, env=env, capture_output=True, text=True, timeout=60)
    output = job.stdout + job.stderr
    assert job.returncode == 0 and "Error" not in output and "OSC UCX" not in output, output
    expected = [BUNDLED_MPI_ENV[name] if bundled_open_mpi() else None for name in ("OMPI_MCA_osc", "OMPI_MCA_btl")]
    assert output.count(f"set: {expected[0]} {expected[1]}") == 2, output
