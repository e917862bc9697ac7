#!/bin/bash
# status.sh: the cifar10-jpeg lanes (contributing/inflight.md): each running cell's round, the lanes' logs, the load.
# Rounds reached by the cifar10-jpeg cells (checkpoint headers) and finished cells.
cd /work/wt-c10
PYTHONPATH=/work/wt-c10 /work/main/.venv/bin/python - <<'PY'
from pathlib import Path
from pflbench.checkpoint import read_header
import time
for store in sorted(Path("results").glob("c10-t*")):
    for cell in sorted(store.iterdir()):
        ck = cell / "checkpoint.pt"
        done = (cell / "result.json").exists() or (cell / "metrics.json").exists()
        if ck.exists():
            h = read_header(ck)
            print(store.name, cell.name, "round", h.get("round"), h.get("algorithm", ""), "age %.0fs" % (time.time() - ck.stat().st_mtime))
        else:
            print(store.name, cell.name, "files:", sorted(p.name for p in cell.iterdir()))
PY
cat /work/lanes/A.log /work/lanes/B.log; cut -d' ' -f1-3 /proc/loadavg
