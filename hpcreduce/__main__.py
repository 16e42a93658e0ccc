"""``python -m hpcreduce``: the same as the ``hpcreduce`` command."""
from hpcreduce.cli.main import main

raise SystemExit(main())
