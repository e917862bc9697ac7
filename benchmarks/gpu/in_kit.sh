#!/usr/bin/env bash
# Any command on a lent GPU machine in the GPU check's environment: the kit (`make gpu-kit`: .gpu-kit/,
# carried) installed over the image's torch and pflbench from this tree (kit_env.sh); the command runs
# from the repository root with $PY the Python to use, e.g.
#   bash benchmarks/gpu/in_kit.sh bash benchmarks/analysis/perfedavg_break.sh "$OUT" CHECKPOINT ...
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
KIT=${PFLBENCH_GPU_KIT:-$REPO/.gpu-kit}
[ -d "$KIT/wheels" ] || { echo "in_kit.sh: no kit at $KIT: run 'make gpu-kit' first" >&2; exit 2; }
WORK=$(mktemp -d /tmp/pflbench-kit.XXXXXX)
PY=${PYTHON:-python3}
source "$REPO/benchmarks/gpu/kit_env.sh"
export PY
exec "$@"
