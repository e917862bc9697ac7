#!/bin/bash
# specs.sh NAME "SPEC:STORE SPEC:STORE ...": runs whole specs one after another from a pinned worktree, each into
# its own store results/STORE, checkpoints every 5 minutes; finished cells are skipped on rerun (so the queue
# resumes where it stopped). For the referee's questions (issue 73), whose specs are ready in benchmarks/, e.g.
#   LANE_WORKTREE=/work/wt-ref specs.sh D "benchmarks/table2-full-175-local.yaml:q2 benchmarks/table2-pfedla-fixed-grid.yaml:q1-grid"
# An item may add its own `--set`s after a third colon, separated by @ (no spaces):
#   benchmarks/table1.yaml:q3-175:dataset=fmnist@clients=10@seed=[1,2]@algorithm=[local,pfedla,fedavg]
# Extra `pflbench run` options for every item (e.g. "--set seed=1") go in LANE_SETS.
name=$1; shift
worktree=${LANE_WORKTREE:?LANE_WORKTREE: the pinned worktree to run from}
set -f  # an item's sets hold brackets: no globbing
mkdir -p /work/lanes; cd "$worktree" || exit 1
export PFLBENCH_DATA_MIRROR=/work/shared/data PYTHONPATH=$worktree
for item in $1; do
  IFS=: read -r spec store sets <<< "$item"
  item_sets=(); IFS=@ read -r -a parts <<< "$sets"; for p in "${parts[@]}"; do item_sets+=(--set "$p"); done
  echo "$(date -Is) start $spec $store load $(cut -d' ' -f1-3 /proc/loadavg)" >> "/work/lanes/$name.log"
  # shellcheck disable=SC2086  # LANE_SETS is a list of options
  /work/main/.venv/bin/pflbench run "$spec" --set resources.gpus=0 "${item_sets[@]}" ${LANE_SETS:-} --results "results/$store" \
     --no-ray --checkpoint-minutes 5 >> "/work/lanes/$name-$store.out" 2>&1; rc=$?  # before the next expansion resets $?
  echo "$(date -Is) end $spec $store rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)" >> "/work/lanes/$name.log"
done
