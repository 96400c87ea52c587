#!/usr/bin/env bash
# The runtime as it ships to a device: an install with the runtime extra alone (no torch, no onnx) runs the runtime's
# tests, then captions the sample photos with no model named (the shipped export, INT8 step), through the shipped
# export's fp32 graphs, which must give PyTorch's captions (the full install, .venv, see setup.sh), and through an
# fp32 export the full install makes now, which must too. Usage: bash scripts/test_runtime_only.sh [pytest arguments]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
full="${EDGECAP_VENV:-$here/.venv}"
venv="${EDGECAP_RUNTIME_VENV:-$here/.venv-runtime}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -e "$here[runtime,serve,video,dev]"
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "error: $venv can import torch; the runtime-only install must not have it" >&2
    exit 1
fi
cd "$here"
"$venv/bin/python" -m pytest tests/runtime -p no:cacheprovider "$@"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$full/bin/edgecap" export --out "$work/export" --precision fp32 > "$work/export.log"
"$full/bin/edgecap" caption edgecap/assets/samples --backend torch --json > "$work/torch.jsonl"
"$venv/bin/edgecap" caption edgecap/assets/samples --model "$work/export" --json > "$work/runtime.jsonl"
"$venv/bin/edgecap" caption edgecap/assets/samples --precision fp32 --json > "$work/shipped.jsonl"
start=$EPOCHREALTIME
"$venv/bin/edgecap" caption edgecap/assets/samples --json > "$work/default.jsonl"
end=$EPOCHREALTIME
"$venv/bin/python" - "$work/torch.jsonl" "$work/runtime.jsonl" "$work/shipped.jsonl" "$work/default.jsonl" \
    "$start" "$end" <<'PY'
import json, sys
torch, runtime, shipped, default = ([json.loads(line)["caption"] for line in open(path)] for path in sys.argv[1:5])
for name, captions in (("a fresh fp32 export", runtime), ("the shipped export's fp32 graphs", shipped)):
    if captions != torch or not torch:
        sys.exit(f"error: the runtime-only install captions differently from PyTorch through {name}: "
                 f"{captions} != {torch}")
if len(default) != len(torch) or not all(default):
    sys.exit(f"error: `edgecap caption` with no model gave {default}")
print(f"runtime-only install: {len(torch)} sample photos captioned as PyTorch captions them, with no torch; "
      f"with no model named (the shipped export, INT8 step) in {float(sys.argv[6]) - float(sys.argv[5]):.1f} s, "
      "start-up included")
PY
