#!/usr/bin/env bash
# The tests left out of the suite (marked "extended" in tests/): more random-kill draws, kill
# points and launchers of behaviours the suite covers once. About 3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -q -m extended tests "$@"
