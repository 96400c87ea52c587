#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the test suite on one pytest-xdist worker per core; a module's tests stay on one
# worker (--dist loadscope), so the tiny runs its fixtures train are trained once. Then the runtime alone, as it
# ships to a device: scripts/test_runtime_only.sh. Extra arguments go to both pytest runs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
cd "$here"
"${EDGECAP_VENV:-$here/.venv}/bin/python" -m pytest -n auto --dist loadscope "$@"
bash "$here/scripts/test_runtime_only.sh" "$@"
