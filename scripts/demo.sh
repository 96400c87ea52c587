#!/usr/bin/env bash
# Set up .venv (see setup.sh) and caption the bundled sample photos with the shipped model.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
edgecap="${EDGECAP_VENV:-$here/.venv}/bin/edgecap"
"$edgecap" caption "$here"/edgecap/assets/samples/*.jpg --attention "${TMPDIR:-/tmp}/edgecap-attention.png"
echo "attention maps: ${TMPDIR:-/tmp}/edgecap-attention-*.png"
