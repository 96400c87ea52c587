#!/usr/bin/env bash
# Set up .venv (see setup.sh), caption the bundled sample photos with the shipped export on ONNX Runtime (no torch in
# that path), then with the shipped checkpoint in PyTorch (drawing each one's attention maps), export the checkpoint
# again (fp32 and mixed fp16 graphs) and caption the same photos through those graphs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
edgecap="${EDGECAP_VENV:-$here/.venv}/bin/edgecap"
samples="$here/edgecap/assets/samples"
out="${TMPDIR:-/tmp}/edgecap-demo"
echo "== the shipped export on ONNX Runtime, INT8 decoder step (what \`edgecap caption\` runs) =="
"$edgecap" caption "$samples"
echo "== PyTorch (the shipped checkpoint), attention maps in $out/attention =="
"$edgecap" caption "$samples" --backend torch --attention "$out/attention"
echo "== export to ONNX, then ONNX Runtime (no torch in this path) =="
"$edgecap" export --out "$here/exports/default" --precision fp32,fp16
for precision in fp32 fp16; do
    echo "-- ONNX Runtime, $precision graphs --"
    "$edgecap" caption "$samples" --model "$here/exports/default" --backend ort --precision "$precision"
done
