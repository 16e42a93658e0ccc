"""``python -m hpcreduce`` and the ``hpcreduce`` command (setup.py's entry point): a rank of
``train`` first catches the stop signals (``runtime.stop.hold_early``: a signal in its first
second, before the imports and MPI's start, is held), then the command runs (``cli.main``)."""
import sys

from hpcreduce.runtime.stop import hold_early


def main() -> int:
    hold_early(sys.argv[1:])
    from hpcreduce.cli.main import main as run_command  # after the handlers: its imports take a second
    return run_command()


if __name__ == "__main__":
    raise SystemExit(main())
