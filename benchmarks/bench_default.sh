#!/usr/bin/env bash
# Bench the shipped default model: export it once (fp32 + fp16) if needed, then time the full grid.
# Usage: benchmarks/bench_default.sh [EXPORT_DIR] [extra `edgecap bench` flags, e.g. --threads 2 --runs 100]
# Reports land in EXPORT_DIR/reports/bench.{json,md,png} (exports/ is git-ignored); the table is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-exports/default}
shift || true
[ -f "$out/edgecap.json" ] || edgecap export --out "$out" --precision fp32,fp16
# int8 is skipped with a note until the export has int8 graphs.
edgecap bench "$out" --backend torch,ort --precision fp32,fp16,int8 --batch 1,4 --beam 1,3 \
    --plot "$out/reports/bench.png" "$@"
