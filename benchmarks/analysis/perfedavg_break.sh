#!/usr/bin/env bash
# Issue 41: Table 2's Per-FedAvg cell (f7af474989db) holds 86-87% for 48 evaluations, then breaks between
# rounds 480 and 490. Five branches of its remaining rounds (benchmarks/analysis/branch.py), side by side on
# one device, from CPU checkpoints of its re-run (same commit, same rounds bit for bit):
#   same        LATE checkpoint, the cell as stored, full float32 (TF32 off)
#   same-tf32   LATE checkpoint, the cell as stored, TF32 convolutions (PyTorch's CUDA default)
#   early       EARLY checkpoint, the cell as stored, full float32: a longer trajectory of other rounding
#   beta-half   LATE checkpoint, meta step beta 5e-4 instead of 1e-3
#   alpha-half  LATE checkpoint, inner / personalization step alpha 0.005 instead of 0.01
# and a sixth process probes the re-run's own trajectory through the break (SNAPSHOTS: a folder of
# `branch.py --write-snapshots` files of its checkpoints). Does the break come back when only the float
# rounding differs, and with smaller steps? The probes (shared model's loss, each client's Hessian top
# eigenvalue against 2/alpha) say what moves before it.
#
#   bash benchmarks/gpu/in_kit.sh bash benchmarks/analysis/perfedavg_break.sh OUT CONFIG LATE EARLY SNAPSHOTS [SECONDS]
# DEVICE (default cuda), UNTIL (default: the cell's last round) and POWER_STEPS (20) are read from the environment.
set -uo pipefail
OUT=${1:?usage: perfedavg_break.sh OUT CONFIG LATE_CHECKPOINT EARLY_CHECKPOINT SNAPSHOTS [SECONDS]}
CONFIG=$2 LATE=$3 EARLY=$4 SNAPSHOTS=$5 SECONDS_EACH=${6:-360}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
mkdir -p "$OUT"
branch() {  # NAME CHECKPOINT TF32 [--set ...]
    local name=$1 checkpoint=$2 tf32=$3
    shift 3
    "$PY" benchmarks/analysis/branch.py "$checkpoint" --config "$CONFIG" --out "$OUT/branch-$name.json" \
        --device "$DEVICE" --tf32 "$tf32" --deadline "$SECONDS_EACH" --probe-every 2 --power-steps "${POWER_STEPS:-20}" \
        ${UNTIL:+--until "$UNTIL"} "$@" > "$OUT/.branch-$name.log" 2>&1
    echo "== $name: exit $? $(date +%T)" >> "$OUT/.branch-$name.log"
}
branch same "$LATE" off &
branch same-tf32 "$LATE" on &
branch early "$EARLY" off &
branch beta-half "$LATE" off --set hp.beta=5e-4 &
branch alpha-half "$LATE" off --set hp.alpha=0.005 &
{ "$PY" benchmarks/analysis/branch.py --config "$CONFIG" --out "$OUT/trajectory.json" --device "$DEVICE" \
      --power-steps "${POWER_STEPS:-20}" --snapshots "$SNAPSHOTS"/snapshot-*.pt > "$OUT/.branch-trajectory.log" 2>&1
  echo "== trajectory: exit $? $(date +%T)" >> "$OUT/.branch-trajectory.log"; } &
if command -v nvidia-smi >/dev/null; then
    sleep 60; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv > "$OUT/.nvidia-smi.txt"
fi
wait
for log in "$OUT"/.branch-*.log "$OUT"/.nvidia-smi.txt; do [ -f "$log" ] && { echo "#### $log"; cat "$log"; }; done > "$OUT/branches.log"
rm -f "$OUT"/.branch-*.log "$OUT/.nvidia-smi.txt"
tail -n 40 "$OUT/branches.log"
