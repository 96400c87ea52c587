#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU, CUDA and TensorRT (a Jetson or a desktop GPU):
# for each export directory, build its TensorRT engines (every precision it has graphs for), gate each precision
# with `edgecap parity --backend trt`, then time torch, ort and trt side by side with `edgecap bench`.
#
# Usage: benchmarks/gpu_check.sh [EXPORT_DIR ...]        (default: every exports/*/ holding an edgecap.json)
# Environment: PYTHON         the interpreter edgecap is installed in (default python3)
#              EDGECAP_DATA   parity data spec   (default flickr8k:../shared/data/flickr8k)
#              EDGECAP_SPLIT  parity split       (default dev)
#              EDGECAP_IMAGES parity images, 0 = the whole split (default 0)
#              EDGECAP_BENCH  extra `edgecap bench` flags, e.g. "--runs 100"
# Reports: EXPORT_DIR/reports/parity-trt-PRECISION.{json,md} and bench.{json,md,png}.
# Exit status: 2 when TensorRT, cuda-python or the GPU is missing or a step errs; 1 when a parity gate failed;
#              3 when a gate was inconclusive (too few photos to tell) and none failed.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
data=${EDGECAP_DATA:-flickr8k:../shared/data/flickr8k}
split=${EDGECAP_SPLIT:-dev}
images=${EDGECAP_IMAGES:-0}
read -r -a bench_flags <<< "${EDGECAP_BENCH:-}"

"$python" - <<'EOF' || exit 2
import sys
from edgecap.errors import EdgecapError
from edgecap.runtime.backends.trt_cuda import require_tensorrt
try:
    require_tensorrt()
except EdgecapError as err:
    sys.exit(f"error: {err}")
EOF

if [ $# -gt 0 ]; then
    dirs=("$@")
else
    dirs=()
    for manifest in exports/*/edgecap.json; do
        [ -f "$manifest" ] && dirs+=("$(dirname "$manifest")")
    done
fi
if [ ${#dirs[@]} -eq 0 ]; then
    echo "error: no export directories given and none in exports/; run \`edgecap export\` first" >&2
    exit 2
fi

failed=0
inconclusive=0
errors=0
for dir in "${dirs[@]}"; do
    precisions=$("$python" -c "import json, sys; graphs = json.load(open(sys.argv[1]))['graphs']
print(','.join(p for p in ('fp32', 'fp16', 'int8') if p in graphs))" "$dir/edgecap.json") || { errors=1; continue; }
    echo "== $dir ($precisions)"
    "$python" -m edgecap export "$dir" --trt --precision "$precisions" || { errors=1; continue; }
    for precision in ${precisions//,/ }; do
        rc=0
        "$python" -m edgecap parity "$dir" --backend trt --precision "$precision" --data "$data" --split "$split" \
            --max-images "$images" || rc=$?
        if [ $rc -eq 1 ]; then failed=1; elif [ $rc -eq 3 ]; then inconclusive=1; elif [ $rc -ne 0 ]; then errors=1; fi
    done
    "$python" -m edgecap bench "$dir" --backend torch,ort,trt --precision "$precisions" --batch 1,4 --beam 1,3 \
        --plot "$dir/reports/bench.png" ${bench_flags[@]+"${bench_flags[@]}"} || errors=1
done
[ $errors -eq 0 ] || exit 2
[ $failed -eq 0 ] || exit 1
[ $inconclusive -eq 0 ] || exit 3
