#!/usr/bin/env bash
# The papers' claims (docs/results.md) as one batch for a GPU machine: every arm's preset recipe on the shipped
# fine-tuned Lite2 (cross-entropy only, so arms compare at the same epochs; Stack-Captioning's whole recipe, whose
# checkpoint may ship), all side by side on the one GPU; then each arm's best checkpoint captions the dev photos
# (dev_captions.py). Java is not needed there: score the captions where it is, with score_captions.py, and pair the
# arms with compare_evals.py (docs/results.md lists the pairs).
#
# Usage: benchmarks/claims_gpu.sh DATA_SPEC OUT_DIR [SECONDS]
#   SECONDS  stop the runs still training after this long (default 0: never); a stopped run keeps the best.pt of
#            the epochs it finished, and its metrics.jsonl says how many that was
# Environment: PYTHON  the interpreter with torch and edgecap's dependencies (default python3)
#              ARMS    the arms to run, by name (default: all of them, listed below)
#              EXTRA   --set options added to every arm (a dry run on a CPU: "--set xe.epochs=1 --set scst.epochs=1")
# Writes OUT_DIR/runs/ARM (run directories), OUT_DIR/logs/ARM.log and OUT_DIR/captions/ARM.json.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 DATA_SPEC OUT_DIR [SECONDS]" >&2; exit 2; }
data=$1 out=$2 seconds=${3:-0}
python=${PYTHON:-python3}
"$python" -c "import sys; from edgecap.data import load_dataset; load_dataset(sys.argv[1])" "$data" || exit 2
read -r -a extra <<< "${EXTRA:-}"

declare -A recipe=(
    [sat-soft]="sat-flickr8k --set scst.epochs=0 --set model.attention=soft"
    [sat-hard]="sat-flickr8k --set scst.epochs=0 --set model.attention=hard"
    [spca-S]="spca-flickr8k --set scst.epochs=0 --set model.variant=S"
    [spca-C]="spca-flickr8k --set scst.epochs=0 --set model.variant=C"
    [spca-SC]="spca-flickr8k --set scst.epochs=0 --set model.variant=S|C"
    [glied-full]="glied-flickr8k --set scst.epochs=0"
    [glied-base]="glied-flickr8k --set scst.epochs=0 --set model.variant=base"
    [a2-gate]="a2-flickr8k --set scst.epochs=0 --set model.alignment=gate"
    [a2-max]="a2-flickr8k --set scst.epochs=0 --set model.alignment=max"
    [a2-moving_average]="a2-flickr8k --set scst.epochs=0 --set model.alignment=moving_average"
    [a2-exponential]="a2-flickr8k --set scst.epochs=0 --set model.alignment=exponential"
    [a2-none]="a2-flickr8k --set scst.epochs=0 --set model.alignment=none"
    [stackcap]="stackcap-flickr8k"
)
read -r -a arms <<< "${ARMS:-${!recipe[*]}}"
mkdir -p "$out/runs" "$out/logs" "$out/captions"

# One run fills the feature caches (on the GPU) while the others wait on its lock: start it first.
pids=()
for arm in "${arms[@]}"; do
    [ -n "${recipe[$arm]:-}" ] || { echo "unknown arm '$arm'; choose from: ${!recipe[*]}" >&2; exit 2; }
    read -r -a args <<< "${recipe[$arm]}"
    OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 timeout "$seconds" "$python" -m edgecap train --data "$data" \
        --out "$out/runs/$arm" --preset "${args[@]}" "${extra[@]}" > "$out/logs/$arm.log" 2>&1 &
    pids+=($!)
    echo "$arm: started (pid $!)"
done
for pid in "${pids[@]}"; do wait "$pid"; done

trained=()
for arm in "${arms[@]}"; do
    epochs=$(grep -c '"phase"' "$out/runs/$arm/metrics.jsonl" 2>/dev/null)
    echo "$arm: ${epochs:-0} epochs; $(tail -c 300 "$out/logs/$arm.log" | tr '\r' '\n' | grep -a . | tail -1)"
    [ -f "$out/runs/$arm/best.pt" ] && trained+=("$out/runs/$arm")
done
[ ${#trained[@]} -gt 0 ] || { echo "no arm finished an epoch" >&2; exit 1; }
"$python" benchmarks/dev_captions.py "${trained[@]}" --data "$data" --out "$out/captions"
