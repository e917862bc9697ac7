#!/usr/bin/env bash
# Any command on a lent GPU machine in the GPU check's environment: the kit (`make gpu-kit`: .gpu-kit/,
# carried) installed over the image's torch and pflbench from this tree (kit_env.sh); the command runs
# from the repository root with $PY the Python to use, e.g.
#   bash benchmarks/gpu/in_kit.sh bash benchmarks/analysis/perfedavg_break.sh "$OUT" CHECKPOINT ...
# PFLBENCH_GPU_KIT: another kit folder (e.g. .gpu-kit-cifar); PYTHON: the Python to use (default python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
KIT=${PFLBENCH_GPU_KIT:-$REPO/.gpu-kit}
[ -d "$KIT/wheels" ] || { echo "in_kit.sh: no kit at $KIT: run 'make gpu-kit' first" >&2; exit 2; }
WORK=$(mktemp -d /tmp/pflbench-kit.XXXXXX)
PY=${PYTHON:-python3}
source "$REPO/benchmarks/gpu/kit_env.sh"
export PY
# `python3 ...` (as the prepared device calls are written) runs $PY: the device's python3 there, the
# rehearsal's device-image Python here (rehearse.py sets PYTHON)
if [ "${1:-}" = python3 ] || [ "${1:-}" = python ]; then shift; set -- "$PY" "$@"; fi
exec "$@"
