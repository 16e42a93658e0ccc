"""``python -m hpcreduce``: the same as the ``hpcreduce`` command. A rank of ``train`` first
catches the stop signals (``runtime.stop.hold_early``: a signal in its first second is held)."""
import sys

from hpcreduce.runtime.stop import hold_early

hold_early(sys.argv[1:])
from hpcreduce.cli.main import main  # noqa: E402 (after the handlers: its imports take a second)

raise SystemExit(main())
