"""Every number read from a file or a flag is bounded where it is parsed (one process): a
discovery file's count of ranks or slots, ``--grow``'s N, ``-n``, and any integer flag."""
import pytest

from hpcreduce.cli.main import build_parser
from hpcreduce.cli.train_cmd import launcher_problems
from hpcreduce.errors import worded
from hpcreduce.ft.resize import GrowthRule, parse_grow, read_discovery
from hpcreduce.runtime.environment import MAX_RANKS

HUGE = "1" + "0" * 22  # 23 digits: past what MPI_Comm_spawn counts in


@pytest.mark.parametrize("text, said", [
    (HUGE, f"asks for {HUGE} ranks; from 1 to {MAX_RANKS} can run"),
    (f"localhost:{HUGE}", f"is not HOST[:SLOTS] (SLOTS a number from 1 to {MAX_RANKS})"),
    (f"localhost:{MAX_RANKS}\nother:1", f"slots add up to {MAX_RANKS + 1}, past the {MAX_RANKS} ranks"),
])
def test_a_discovery_file_asking_for_more_ranks_than_a_job_may_have_is_a_problem_not_a_spawn(tmp_path, text, said):
    path = tmp_path / "hosts"
    path.write_text(text + "\n")
    assert said in str(read_discovery(str(path))), read_discovery(str(path))
    found = GrowthRule(discover=str(path)).wanted(0)  # what the job then does: warn and go on unchanged
    assert isinstance(found, str) and said in found
    path.write_text(f"{MAX_RANKS}\n")
    assert read_discovery(str(path)).total == MAX_RANKS


def test_grow_and_n_are_bounded_by_the_ranks_a_job_may_have():
    assert parse_grow(f"{MAX_RANKS}@3") == (MAX_RANKS, 3)
    with pytest.raises(ValueError, match=f"N must be from 1 to {MAX_RANKS}"):
        parse_grow(f"{HUGE}@3")
    args = build_parser().parse_args(["train", "-n", HUGE])
    assert f"-n must be from 1 to {MAX_RANKS}, got {HUGE}" in [worded(p) for p in launcher_problems(args)]


def test_an_integer_flag_past_int64_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["train", "--seed", HUGE])
    assert exited.value.code == 2
    assert f"argument --seed: {HUGE} is past the 64-bit integers" in capsys.readouterr().err
    assert build_parser().parse_args(["train", "--seed", str((1 << 63) - 1)]).seed == (1 << 63) - 1
