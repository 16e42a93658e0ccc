"""``python -m hpcreduce``: the same as the ``hpcreduce`` command."""
from .cli.main import main

raise SystemExit(main())
