#!/usr/bin/env bash
# The checks that need a CUDA GPU but not TensorRT, for a machine that has PyTorch with CUDA and cuda-python
# (`gpu_check.sh` is the one that needs TensorRT):
#   1. the `gpu`-marked tests: the TensorRT backend's CUDA half (trt_cuda.Cuda: allocations, copies, the on-device
#      row repeat, CUDA-graph replay) through real cuda-python, and a training run that must use the GPU;
#   2. the training, export and CLI tests, which train on the GPU there (edgecap trains on CUDA whenever it is
#      visible), so every checkpoint they export and caption with came from a GPU run.
# Tests that need Java (pycocoevalcap scoring) or ../shared/data skip with a one-line reason where those
# are missing; the summary lists them.
#
# Usage: benchmarks/cuda_check.sh [PYTEST_ARGS ...]     (run from anywhere; extra arguments go to both pytest calls)
# Environment: PYTHON   the interpreter with torch+CUDA (default python3); edgecap is installed into it, no deps
#              WORKERS  pytest-xdist workers for part 2 when pytest-xdist is there (default 8)
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
workers=${WORKERS:-8}

"$python" - <<'EOF' || exit 2
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("error: torch sees no CUDA GPU; run this on a machine with one")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}")
EOF
"$python" -m pip install -q --no-deps --no-build-isolation -e . || exit 2

parallel=()
"$python" -c "import xdist" 2>/dev/null && parallel=(-n "$workers")
rc=0
echo "== 1. gpu-marked tests"
"$python" -m pytest -q -m gpu -rs "$@" || rc=1
echo "== 2. training, export and CLI tests, training on the GPU"
"$python" -m pytest -q -m "not gpu and not tensorrt" ${parallel[@]+"${parallel[@]}"} -rfs \
    tests/training tests/export tests/test_cli.py tests/test_parity.py "$@" || rc=1
exit $rc
