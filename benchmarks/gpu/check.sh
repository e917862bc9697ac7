#!/usr/bin/env bash
# The GPU check: one command on a lent GPU machine (no network, its own Python and torch), with the kit
# (`make gpu-kit`: .gpu-kit/, carried to the device) installed over the image's torch. Every step is
# time-boxed and independent; OUT receives check.json (every step's status and figures) and check.log.
#
#   bash benchmarks/gpu/check.sh OUT                 # on a CUDA machine (refuses clearly without one)
#   bash benchmarks/gpu/check.sh OUT --rehearse      # the same steps on this CPU, tiny sizes, in an
#                                                    # environment of the device image's packages + the kit
#   bash benchmarks/gpu/check.sh OUT [--rehearse] --only graphs,kernels   # further options go to check.py
# Where the machine has network, `make install` and then `.venv/bin/python benchmarks/gpu/check.py --out OUT`
# runs the steps in the project's own environment instead.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
OUT=${1:?usage: check.sh OUT [--rehearse] [options of check.py, e.g. --only graphs,kernels]}
shift
REHEARSE=""
if [ "${1:-}" = "--rehearse" ]; then REHEARSE="--rehearse"; shift; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
KIT=${PFLBENCH_GPU_KIT:-$REPO/.gpu-kit}
if [ ! -d "$KIT/wheels" ]; then
    echo "check.sh: no kit at $KIT: run 'make gpu-kit' first (it needs the network and ../shared/data)" >&2
    exit 2
fi
WORK=$(mktemp -d /tmp/pflbench-gpu.XXXXXX)
if [ -n "$REHEARSE" ]; then
    # the device image's packages (links into this machine's environment) and nothing else
    PY=$("${PYTHON:-$REPO/.venv/bin/python}" benchmarks/gpu/rehearse_env.py "$WORK/env") || exit 2
else
    PY=${PYTHON:-python3}
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        echo "check.sh: torch sees no CUDA device on this machine: nothing to check here (--rehearse runs the steps on the CPU)" >&2
        echo '{"refused": "torch sees no CUDA device"}' > "$OUT/check.json"
        exit 3
    fi
fi
source "$REPO/benchmarks/gpu/kit_env.sh"
exec "$PY" benchmarks/gpu/check.py --out "$OUT" --work "$WORK" $REHEARSE "$@"
