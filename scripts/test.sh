#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the test suite on one pytest-xdist worker per core; a module's tests stay on one
# worker (--dist loadscope), so the tiny runs its fixtures train are trained once. Then the runtime alone, as it
# ships to a device: scripts/test_runtime_only.sh. Extra arguments go to both pytest runs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
# The Triton repository's test serves it with the tritonserver that nvidia-pytriton bundles (installed without its
# Python dependencies, which pin numpy<2), from an environment of its own: Triton 2.51's Python stub garbles every
# tensor under numpy 2 (tests/triton_server.py).
triton="${EDGECAP_TRITON_VENV:-$here/.venv-triton}"
[ -x "$triton/bin/python" ] || python3 -m venv "$triton"
"$triton/bin/pip" install -q --disable-pip-version-check "numpy<2" "tritonclient[grpc]>=2.50" -e "$here[runtime]"
"$triton/bin/pip" install -q --disable-pip-version-check --no-deps "nvidia-pytriton==0.7.0"
cd "$here"
"${EDGECAP_VENV:-$here/.venv}/bin/python" -m pytest -n auto --dist loadscope "$@"
bash "$here/scripts/test_runtime_only.sh" "$@"
