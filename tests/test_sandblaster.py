"""Sandblaster (``--mode sandblaster``): exactly-once gradients with backups, L-BFGS to scipy's
optimum for K = 1, 2, 3, a user's Model (one 5-rank MPI job), and bad input refused by name."""
import pytest

from mpi_run import hpcreduce_cli, mpirun_in_stages


@pytest.mark.timeout(3600)  # a hang is a stage that outlasts its share (mpirun_in_stages), not a total
def test_sandblaster_gradient_lbfgs_and_user_model():
    result = mpirun_in_stages(5, "sandblaster_checks.py")
    assert result.returncode == 0, result.output
    assert "sandblaster checks passed" in result.output, result.output


@pytest.mark.parametrize("flags, said", [
    (["--optimizer", "lbfgs"], "--optimizer 'lbfgs' is a batch method of --mode sandblaster"),
    (["--mode", "sandblaster", "--optimizer", "adagrad"], "--optimizer 'adagrad' does not fit --mode sandblaster"),
    (["--mode", "sandblaster", "--unit", "0"], "--unit must be from 1 to --batch"),
    (["--mode", "sandblaster", "--batch", "100", "--unit", "101"], "--unit must be from 1 to --batch (100), got 101"),
    (["--mode", "sandblaster", "--gtol", "-1"], "--gtol must be >= 0"),
    (["--mode", "sandblaster", "--ftol", "-0.5"], "--ftol must be >= 0"),
    (["--mode", "sandblaster", "--l2", "nan"], "--l2 must be >= 0"),
    (["--mode", "sandblaster", "--history", "0"], "--history and --push-units must be at least 1"),
    (["--mode", "sandblaster", "--slow", "7:4"], "--slow 7:4"),
    (["--mode", "sandblaster", "--servers", "3"], "--mode sandblaster needs --servers K >= 1"),
    (["--mode", "sandblaster", "--backups", "sometimes"], "--backups must be on or off"),
    (["--mode", "ring", "--unit", "8"], "--unit only applies to --mode sandblaster"),
    (["--mode", "sandblaster", "--lr", "1e-9"], "--lr applies to --mode ring and ps; --mode sandblaster's line search"),
    (["--mode", "sandblaster", "--model", "mlp", "--lr", "1e6"], "--lr applies to --mode ring and ps"),
])
def test_bad_sandblaster_input_refused_by_flag(flags, said):
    result = hpcreduce_cli("train", "-n", "4", *flags, timeout=60)
    assert result.returncode == 2, result.output
    assert said in result.output, result.output
