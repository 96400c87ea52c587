#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
cd "$here"
"${EDGECAP_VENV:-$here/.venv}/bin/python" -m pytest "$@"
