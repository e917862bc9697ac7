#!/bin/bash
# carry.sh: copy each unfinished cifar10-jpeg cell's last round checkpoint from the pinned worktree's stores into
# contributing/inflight/checkpoints/7348687/STORE/CELL/ (xz -6, split under 4.5 MB, with its SHA-256), and drop
# the carried folder of a cell that has finished (a summary.json and no checkpoint in the store) (its result is published from the worktree's store).
# Another pinned worktree's stores: CARRY_WORKTREE=/work/wt-q5 CARRY_COMMIT=0759e6a CARRY_STORES=q5-cpu-batched carry.sh
set -euo pipefail
stores=${CARRY_STORES:-c10-t*}
carried=/work/main/contributing/inflight/checkpoints/${CARRY_COMMIT:-7348687}
cd "${CARRY_WORKTREE:-/work/wt-c10}/results"
for ck in $stores/*/checkpoint.pt; do
    cell=$(dirname "$ck"); out=$carried/$cell; tmp=$(mktemp -d)
    cp "$ck" "$tmp/checkpoint.pt"                  # a copy: the running cell may replace its checkpoint meanwhile
    rm -rf "$out"; mkdir -p "$out"
    xz -6 -c "$tmp/checkpoint.pt" | split -b 4500k - "$out/checkpoint.pt.xz.part-"
    sha256sum "$tmp/checkpoint.pt" | cut -d' ' -f1 > "$out/checkpoint.pt.sha256"
    cat "$out"/checkpoint.pt.xz.part-* | xz -d | sha256sum -c <(echo "$(cat "$out/checkpoint.pt.sha256")  -") >/dev/null
    if [ "$(du -sm "$out" | cut -f1)" -gt "${CARRY_MAX_MB:-20}" ]; then   # e.g. pFedHN's hypernetwork: 86 MB
        echo "not carried $cell: $(du -sh "$out" | cut -f1) compressed, over ${CARRY_MAX_MB:-20} MB (a new machine reruns it)"
        rm -rf "$out"
    else
        echo "carried $cell: $(du -sh "$out" | cut -f1)"
    fi
    rm -rf "$tmp"
done
for out in "$carried"/$stores/*/; do
    cell=$(basename "$(dirname "$out")")/$(basename "$out")
    if [ -f "$cell/summary.json" ] && [ ! -f "$cell/checkpoint.pt" ]; then
        echo "finished: $cell (carried copy dropped)"; rm -rf "$out"
    fi
done
