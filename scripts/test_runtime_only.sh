#!/usr/bin/env bash
# The runtime as it ships to a device: an install with the runtime extra alone (no torch, no onnx) runs the runtime's
# tests, then captions the sample photos through an fp32 export of the shipped model made by the full install (.venv,
# see setup.sh) and must give PyTorch's captions. Usage: bash scripts/test_runtime_only.sh [pytest arguments]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
full="${EDGECAP_VENV:-$here/.venv}"
venv="${EDGECAP_RUNTIME_VENV:-$here/.venv-runtime}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -e "$here[runtime,dev]"
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "error: $venv can import torch; the runtime-only install must not have it" >&2
    exit 1
fi
cd "$here"
"$venv/bin/python" -m pytest tests/runtime -p no:cacheprovider "$@"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$full/bin/edgecap" export --out "$work/export" --precision fp32 > "$work/export.log"
"$full/bin/edgecap" caption edgecap/assets/samples --json > "$work/torch.jsonl"
"$venv/bin/edgecap" caption edgecap/assets/samples --model "$work/export" --json > "$work/runtime.jsonl"
"$venv/bin/python" - "$work/torch.jsonl" "$work/runtime.jsonl" <<'PY'
import json, sys
torch, runtime = ([json.loads(line)["caption"] for line in open(path)] for path in sys.argv[1:])
if torch != runtime or not torch:
    sys.exit(f"error: the runtime-only install captions differently from PyTorch: {runtime} != {torch}")
print(f"runtime-only install: {len(torch)} sample photos captioned as PyTorch captions them, with no torch")
PY
