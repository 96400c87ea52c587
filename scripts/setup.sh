#!/usr/bin/env bash
# Create .venv with the CPU build of PyTorch and edgecap installed in editable mode.
# Usage: source scripts/setup.sh   (idempotent: a second call only re-checks the install)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${EDGECAP_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# Pin torch first: an unpinned torch requirement would otherwise pull a multi-GB CUDA build.
"$venv/bin/pip" install -q --disable-pip-version-check "torch==2.13.0"
"$venv/bin/pip" install -q --disable-pip-version-check -e "$here[train,export,runtime,serve,video,dev]"
