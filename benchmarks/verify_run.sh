#!/usr/bin/env bash
# Everything a trained run must show before it is reported: dev scores, export at every precision,
# parity per precision on the dev split, and the ORT vs PyTorch bench.
# Usage: benchmarks/verify_run.sh RUN_DIR EXPORT_DIR DATA_SPEC [CALIB_METHOD] [INT8_GRAPHS]
#        (e.g. flickr8k:../shared/data/flickr8k; CALIB_METHOD max (default), entropy or percentile;
#        INT8_GRAPHS encoder,step (default) or step: the Transformers' INT8 step beside the fp16 encoder)
# Writes EXPORT_DIR/reports/{eval.json,parity-*.json,parity-*.md,bench.json,bench.md}; prints each summary.
set -euo pipefail
cd "$(dirname "$0")/.."
run=$1 out=$2 data=$3 calib=${4:-max} int8_graphs=${5:-encoder,step}
edgecap=${EDGECAP:-edgecap}
# Export first: it replaces the whole directory, and refuses one that holds anything but an export.
$edgecap export "$run" --out "$out" --precision fp32,fp16,int8 --calib-data "$data" --calib-method "$calib" \
    --int8-graphs "$int8_graphs"
mkdir -p "$out/reports"
$edgecap eval "$run" --data "$data" --split dev --beam 3 --json "$out/reports/eval.json"
# Every gate runs whatever the one before it said (parity exits 1 on a failure, 3 when inconclusive); the script
# exits with the first gate's code that was not a pass, after the bench.
verdict=0
for precision in fp32 fp16 int8; do
    code=0
    $edgecap parity "$out" --data "$data" --split dev --precision "$precision" \
        --json "$out/reports/parity-$precision.json" --markdown "$out/reports/parity-$precision.md" || code=$?
    [ "$code" -le 1 ] || [ "$code" -eq 3 ] || exit "$code"  # 2: bad input, nothing was judged
    [ "$verdict" -ne 0 ] || verdict=$code
done
$edgecap bench "$out" --backend torch,ort --precision fp32,int8 --batch 1 --beam 3
exit "$verdict"
