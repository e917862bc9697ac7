#!/bin/bash
# lane.sh NAME "t1:pfedme t2:pfedme ...": runs the CIFAR-10 (cifar10-jpeg) paper-scale cells one after another
# from the pinned worktree /work/wt-c10, checkpoints every 5 minutes; a finished cell is skipped on rerun.
name=$1; shift
mkdir -p /work/lanes; cd /work/wt-c10
export PFLBENCH_DATA_MIRROR=/work/shared/data PYTHONPATH=/work/wt-c10
for item in $1; do
  t=${item%%:*}; a=${item##*:}
  spec=benchmarks/table${t#t}.yaml
  echo "$(date -Is) start $t $a load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/lanes/$name.log
  /work/main/.venv/bin/pflbench run $spec --set dataset=cifar10-jpeg --set clients=10 --set seed=0 \
     --set resources.gpus=0 --set algorithm=$a --results results/c10-$t --no-ray --checkpoint-minutes 5 \
     >> /work/lanes/$name-$t-$a.out 2>&1
  echo "$(date -Is) end $t $a rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/lanes/$name.log
done
