#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the test suite on one pytest-xdist worker per core; a module's tests stay on
# one worker (--dist loadscope), so the tiny runs its fixtures train are trained once. Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
cd "$here"
"${EDGECAP_VENV:-$here/.venv}/bin/python" -m pytest -n auto --dist loadscope "$@"
