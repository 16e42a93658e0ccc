"""A file system that fills during a run: each writer ends the run with an ``OutputFileError``
naming its file on every rank, never a raw OSError and an MPI_Abort (issue 26, class 4).

Real full file systems: a 64 KiB tmpfs filled to the last byte, which needs root (mount);
elsewhere the tests are skipped, saying so.
"""
import os
import subprocess

import pytest

from mpi_run import hpcreduce_cli


@pytest.fixture
def full_folder(tmp_path):
    """A folder on a tmpfs with no space left (unmounted after the test)."""
    folder = tmp_path / "full"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                             capture_output=True, text=True) if os.geteuid() == 0 else None
    if mounted is None or mounted.returncode != 0:
        pytest.skip("a small tmpfs needs root and mount: " + (mounted.stderr.strip() if mounted else "not root"))
    try:
        filler = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"\0" * 4096):
                pass
        except OSError:  # no space left
            pass
        finally:
            os.close(filler)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_the_ps_push_ledger_on_a_full_disk_is_an_output_file_error_on_every_rank(full_folder):
    ledger = full_folder / "ckpt" / "ps-pushes" / "worker-0.bin"
    job = hpcreduce_cli("train", "-n", "3", "--mode", "ps", "--servers", "1", "--steps", "6", "--table-rows", "1024",
                        "--quiet", "--checkpoint-dir", str(full_folder / "ckpt"), "--checkpoint-every", "100",
                        timeout=120)
    assert job.returncode == 1 and "Traceback" not in job.output and "OSError" not in job.output, job
    for rank in range(3):
        assert f"hpcreduce train: error on rank {rank} of 3: cannot write {ledger}: No space left on device" \
            in job.output, job.output
