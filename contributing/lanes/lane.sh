#!/bin/bash
# lane.sh NAME "t1:pfedme t2:pfedme ...": runs paper-scale cells one after another from a pinned worktree,
# checkpoints every 5 minutes; a finished cell is skipped on rerun. By default the CIFAR-10 (cifar10-jpeg)
# 10-client columns from /work/wt-c10 into results/c10-tN; LANE_WORKTREE, LANE_DATASET and LANE_STORE (the
# stores' prefix) name another column, e.g. the methods since 2022 on Fashion-MNIST:
#   LANE_WORKTREE=/work/wt-recent LANE_DATASET=fmnist LANE_STORE=f600 lane.sh C "t1:fedrod t1:fedala ..."
name=$1; shift
worktree=${LANE_WORKTREE:-/work/wt-c10}; dataset=${LANE_DATASET:-cifar10-jpeg}; store=${LANE_STORE:-c10}
mkdir -p /work/lanes; cd "$worktree" || exit 1
export PFLBENCH_DATA_MIRROR=/work/shared/data PYTHONPATH=$worktree
for item in $1; do
  t=${item%%:*}; a=${item##*:}
  spec=benchmarks/table${t#t}.yaml
  echo "$(date -Is) start $t $a load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/lanes/$name.log
  /work/main/.venv/bin/pflbench run $spec --set dataset=$dataset --set clients=10 --set seed=0 \
     --set resources.gpus=0 --set algorithm=$a --results results/$store-$t --no-ray --checkpoint-minutes 5 \
     >> /work/lanes/$name-$t-$a.out 2>&1; rc=$?  # before the next expansion resets $?
  echo "$(date -Is) end $t $a rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/lanes/$name.log
done
