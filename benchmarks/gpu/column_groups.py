"""Table 1's Fashion-MNIST column as one cell group on the GPU: its rows' first rounds timed in lock-step, and
the paper's rounds projected, per row and for the column (issue 56: a whole column inside one device loan).

The cells: benchmarks/table1.yaml's Fashion-MNIST cells at seed 0, one per row of `--algorithms`, with
`--clients` 10 (600 rounds x 10 local epochs, every client joining; every 10 rounds an evaluation that
adapts every client 10 epochs) or 100 (2500 rounds x 20 epochs, 10 of the 100 joining; every 50 rounds all
100 adapted 20 epochs): the paper's settings (`--samples` and `--epochs` shrink them for the CPU rehearsal).
They run as one cell group (`pflbench.simulator.groups.run_group`: what `pflbench run` forms on CUDA, `--cell-groups
auto`), on the engine's path for the device (`--client-batching`), for `--rounds` R rounds each: round 1 is
the warm-up, rounds 2..R-1 only train, and round R also evaluates (each cell's eval_every set to R; nothing
else of a cell changes, its schedule included). With `--evaluation projected` no round evaluates (rounds
2..R are timed) and an evaluation's seconds are projected from the row's round: its counted work over the
round's (an evaluation of 100 clients is ten rounds' work, too long for the step's time box). A round's end
is stamped after `torch.cuda.synchronize()` (on CUDA), so the GPU's queued work is inside the round timed.
A cell stops at the end of a round after which the next would end past `--seconds` from the start (by the
last round's length, twice that for the evaluating round); its figures then come from the rounds it timed.

Figures (`--json`). The group (`group`): its seconds per round, a round of the group ending when its last
cell ends it (in lock-step each cell ends one round a group cycle, at its own point in the cycle: one row's
few rounds are skewed by where that point is, the group's are not); an evaluation's seconds; the paper's
rounds projected, `rounds x seconds_per_round_with_evaluation` (a round plus its share of an evaluation,
1/eval_every): the column's projected wall time, its cells running together; and the aggregate training
throughput in sample-steps/s, one sample through one local training step (forward, backward, update) being
one sample-step: the cells' sample-steps of a training round (evaluation apart), summed, over the group's
seconds per round. A row's sample-steps of a round are as step_count.py counted them for its setting
(step_counts.json; a setting without a count, as the rehearsal's: joining clients x train samples x local
epochs, and `counted` false). Beside it what one cell per process reached: the GPU check's `concurrent` step
(`--sharing`) and the H100's recorded plateau (316k samples/s of FedAvg's training: its sample-steps).
Per row (`rows`): the same from its own stamps (skewed as said), of which `own`: its seconds a round outside
the group's rendezvous (its own steps, as pFedMe's and Per-FedAvg's, its server step, its evaluation: what
it adds to the group's round; the rest is the shared batched step and waiting); its training calls and how
many shared a step; its status. The GPU's peak memory.

    python benchmarks/gpu/column_groups.py --device cuda --clients 10 --rounds 5 --seconds 75 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the scripts beside this one (PYTHONSAFEPATH leaves the script's folder out)
from paper_slice import load_counts  # noqa: E402
from sharing import REPO  # noqa: E402
from step_count import at_epochs, setting_key  # noqa: E402

ROWS = ["local", "fedavg", "perfedavg", "pfedme", "pfedhn", "fedbn", "fedrep", "fedfomo", "pfedla", "heurpfedla"]
H100 = HERE / "h100-2026-11-26.json"  # the check whose `concurrent` step gave the one-cell-per-process plateau


class Enough(Exception):
    """Raised from a cell's round callback once the script's time is up: the cell stops (run_group's passthrough)."""


def column_cells(algorithms: list[str], clients: int, rounds: int, evaluation: str, samples: int | None,
                 epochs: int | None) -> list[tuple]:
    """(cell, the spec's eval_every) for Table 1's Fashion-MNIST cells of `algorithms` at `clients` clients,
    seed 0, evaluating at round `rounds` (evaluation "timed") or not before the spec's last round
    ("projected"); `samples`, `epochs`: a rehearsal's smaller settings."""
    from pflbench.run.spec import load_spec

    cells = []
    for algorithm in algorithms:
        # the client count picked from the spec's own cells (its 100-client setting has 10% joining)
        sets = {"dataset": "fmnist", "seed": 0, "algorithm": algorithm, "resources.gpus": 0}
        [cell] = [c for c in load_spec(REPO / "benchmarks" / "table1.yaml", sets=sets).cells if c.clients == clients]
        update: dict = {"eval_every": rounds if evaluation == "timed" else cell.rounds}
        if samples:
            update["partition_params"] = {**cell.partition_params, "samples_per_client": samples}
        if epochs:
            update.update(local_epochs=epochs, finetune_epochs=epochs)
        cells.append((cell.model_copy(update=update), cell.eval_every))
    return cells


def work_per_client(cell, counts: dict) -> dict:
    """A joining client's sample-steps in a round, and a client's in an evaluation (sample-steps and forwards),
    as counted for the cell's setting (step_count.py), or nominal where not counted."""
    count = counts.get(setting_key(cell))
    if count is not None:
        return {"counted": True, "round": at_epochs(count["round_grad"], cell.local_epochs),
                "evaluation": at_epochs(count["eval_grad"], cell.finetune_epochs),
                "evaluation_forwards": at_epochs(count["eval_forward"], cell.finetune_epochs)}
    per_client = cell.partition_params.get("samples_per_client") or 0
    train = per_client * cell.train_fraction * (1 - cell.val_fraction)
    return {"counted": False, "round": train * cell.local_epochs, "evaluation": train * cell.finetune_epochs,
            "evaluation_forwards": per_client * (1 - cell.train_fraction)}


def plateau(path: str | Path | None) -> float | None:
    """The highest total throughput (samples/s) of a `concurrent` step's runs: its JSON, or a check's."""
    if not path or not Path(path).exists():
        return None
    stored = json.loads(Path(path).read_text())
    if "steps" in stored:
        stored = stored["steps"].get("concurrent", {}).get("figures") or {}
    runs = stored.get("runs") or []
    return max((run["total_samples_per_second"] for run in runs), default=None)


def row_figures(stamps: list[tuple[int, float, float]], evaluated: int | None, paper_eval_every: int,
                rounds: int, work: dict, joining: int, clients: int) -> dict:
    """One row's figures from its stamps (round, seconds since the start, seconds at the rendezvous so far);
    `evaluated`: the round that evaluated (None: none did; an evaluation is then projected)."""
    timed_eval = evaluated is not None and len(stamps) >= 3 and stamps[-1][0] == evaluated
    training = stamps[:-1] if timed_eval else stamps
    if len(training) < 2:
        return {"rounds_run": len(stamps), "error": "no round timed after the warm-up"}
    diffs = [(b[1] - a[1], b[2] - a[2]) for a, b in zip(training, training[1:])]
    per_round = sum(d for d, _ in diffs) / len(diffs)
    waited = sum(w for _, w in diffs) / len(diffs)
    round_work = joining * work["round"]
    eval_work = clients * work["evaluation"]
    if timed_eval:
        eval_seconds = max(0.0, stamps[-1][1] - stamps[-2][1] - per_round)
        eval_how = "timed"
    else:
        eval_seconds = per_round * eval_work / round_work if round_work else 0.0
        eval_how = "projected from the round by counted work"
    with_eval = per_round + eval_seconds / paper_eval_every
    return {"rounds_run": len(stamps), "rounds_timed": len(diffs), "seconds_per_round": per_round,
            "own_seconds_per_round": per_round - waited, "evaluation_seconds": eval_seconds,
            "evaluation": eval_how, "eval_every": paper_eval_every,
            "seconds_per_round_with_evaluation": with_eval, "cell_rounds": rounds,
            "projected_cell_seconds": rounds * with_eval, "sample_steps_per_round": round_work,
            "sample_steps_per_evaluation": eval_work, "counted": work["counted"],
            "sample_steps_per_second": round_work / per_round if per_round > 0 else None,
            "first_round_seconds": stamps[0][1]}


def group_figures(stamps: list[list[tuple[int, float, float]]], evaluated: int | None, eval_every: int,
                  rounds: int, round_work: list[float], eval_work: list[float]) -> dict:
    """The group's pace from its cells' stamps. In lock-step every cell ends one round a group cycle, but
    where in the cycle its round ends differs by cell (its training call is where it waits), so one cell's
    few rounds are skewed by that; a round of the group ends when its last cell ends it: T(r) = the latest
    stamp of round r over the cells that ran rounds 1..r. The pace: (T(last) - T(1)) / (last - 1) over the
    training rounds every such cell ran; the evaluation: T(evaluated) - T(evaluated - 1) - pace. `round_work`,
    `eval_work`: per cell, its sample-steps in a round and in an evaluation."""
    ends: dict[int, list[float]] = {}
    for stamp in stamps:
        for r, (rnd, at, _) in enumerate(stamp, 1):
            if rnd == r:  # rounds 1..r all stamped (a cell that left early stops here)
                ends.setdefault(rnd, []).append(at)
    everyone = len([stamp for stamp in stamps if stamp])
    full = [r for r in sorted(ends) if len(ends[r]) == everyone]
    timed_eval = evaluated is not None and evaluated in full and evaluated >= 3
    training = [r for r in full if not (timed_eval and r == evaluated)]
    if everyone == 0 or len(training) < 2:
        return {"error": "no group round timed after the warm-up"}
    T = {r: max(ends[r]) for r in full}
    pace = (T[training[-1]] - T[1]) / (training[-1] - 1)
    if timed_eval:
        assert evaluated is not None  # timed_eval
        evaluation = max(0.0, T[evaluated] - T[evaluated - 1] - pace)
        how = "timed"
    else:
        evaluation = pace * sum(eval_work) / sum(round_work) if sum(round_work) else 0.0
        how = "projected from the round by counted work"
    with_eval = pace + evaluation / eval_every
    return {"rounds_timed": training[-1] - 1, "seconds_per_round": pace, "evaluation_seconds": evaluation,
            "evaluation": how, "seconds_per_round_with_evaluation": with_eval, "rounds": rounds,
            "projected_seconds": rounds * with_eval,
            "sample_steps_per_round": sum(round_work), "sample_steps_per_second": sum(round_work) / pace if pace else None,
            "first_round_seconds": T[1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--clients", type=int, choices=(10, 100), default=10)
    parser.add_argument("--algorithms", default=",".join(ROWS))
    parser.add_argument("--rounds", type=int, default=5, help="rounds run by each cell (at least 3)")
    parser.add_argument("--evaluation", choices=("timed", "projected"), default="timed")
    parser.add_argument("--seconds", type=float, default=75.0,
                        help="no cell starts a round expected to end later than this after the start")
    parser.add_argument("--samples", type=int, default=None, help="samples per client (default: the spec's)")
    parser.add_argument("--epochs", type=int, default=None, help="local and adaptation epochs (default: the spec's)")
    parser.add_argument("--client-batching", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                        help="the batched step captured as a CUDA graph (pflbench.simulator.static_step)")
    parser.add_argument("--sharing", default=None, help="the concurrent step's JSON (one cell per process)")
    parser.add_argument("--counts", default=None, help="step_count.py's JSON (default: step_counts.json here)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (a warm-up round, a timed round, an evaluated round)")
    began = time.perf_counter()
    import torch

    from pflbench.simulator import groups
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.resolve import resolve
    from pflbench.simulator.rounds import prepare_cell

    cuda = args.device.startswith("cuda")
    algorithms = args.algorithms.split(",")
    planned = column_cells(algorithms, args.clients, args.rounds, args.evaluation, args.samples, args.epochs)
    cells = [resolve(cell) for cell, _ in planned]
    for cell in cells:  # decoded, partitioned and cached before the clock starts
        prepare_cell(cell)
    counts = load_counts(args.counts)

    # Seconds each cell spends at the group's rendezvous (the shared step and waiting), by member name (its index).
    waited: dict[str, float] = {}
    lock = threading.Lock()
    original = groups.CellGroup._rendezvous

    def timed(self, member, request):
        start = time.perf_counter()
        try:
            return original(self, member, request)
        finally:
            with lock:
                waited[member.name] = waited.get(member.name, 0.0) + time.perf_counter() - start

    groups.CellGroup._rendezvous = timed
    stamps: list[list[tuple[int, float, float]]] = [[] for _ in cells]
    start = time.perf_counter()

    def stamper(i: int):
        def on_round(info: dict) -> None:
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            stamps[i].append((info["round"], now - start, waited.get(str(i), 0.0)))
            if len(stamps[i]) >= 2 and info["round"] < args.rounds:
                # the next round's expected end, by the last round's length (an evaluating one: twice that)
                last = stamps[i][-1][1] - stamps[i][-2][1]
                evaluates = args.evaluation == "timed" and info["round"] + 1 == args.rounds
                if now - began + last * (2 if evaluates else 1) > args.seconds:
                    raise Enough
        return on_round

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    run = groups.run_group(cells, execution=ExecutionOptions(device=args.device, client_batching=args.client_batching,
                                                                cuda_graphs=args.cuda_graphs),
                           on_round=[stamper(i) for i in range(len(cells))], stop_after=args.rounds,
                           passthrough=(Enough,))
    seconds = time.perf_counter() - start
    groups.CellGroup._rendezvous = original

    rows: dict = {}
    failed = []
    for (cell, paper_eval_every), result, stats, stopped, stamp in zip(planned, run.results, run.stats, run.stopped,
                                                                        stamps):
        joining = max(1, round(cell.clients * cell.participation))
        row = row_figures(stamp, args.rounds if args.evaluation == "timed" else None, paper_eval_every, cell.rounds,
                          work_per_client(cell, counts), joining, cell.clients)
        status = "stopped at the time limit" if stopped is not None else (result.status if result else "none")
        row.update(status=status, calls=stats.calls if stats else None, merged_calls=stats.merged if stats else None,
                   mean_merged_width=stats.as_dict()["mean_merged_width"] if stats else None,
                   path=(result.summary or {}).get("client_batching") if result else None)
        if result is not None and result.status == "failed":
            failed.append(cell.algorithm)
            row["error"] = (result.error or "").strip().splitlines()[-1:]
        rows[cell.algorithm] = row
    works = [work_per_client(cell, counts) for cell, _ in planned]
    joining = [max(1, round(cell.clients * cell.participation)) for cell, _ in planned]
    group = group_figures(stamps, args.rounds if args.evaluation == "timed" else None, planned[0][1],
                          planned[0][0].rounds, [j * w["round"] for j, w in zip(joining, works)],
                          [cell.clients * w["evaluation"] for (cell, _), w in zip(planned, works)])
    throughput = group.get("sample_steps_per_second") or 0.0
    sharing, recorded = plateau(args.sharing), plateau(H100)
    figures = {
        "device": args.device, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cells": f"table1 fmnist {args.clients} clients, seed 0, {len(cells)} rows as one cell group",
        "rounds": args.rounds, "evaluation": args.evaluation,
        "samples_per_client": cells[0].partition_params.get("samples_per_client"),
        "local_epochs": cells[0].local_epochs, "client_batching": args.client_batching,
        "cuda_graphs": args.cuda_graphs,
        "counted": all(w["counted"] for w in works),
        "rows": rows, "group": group, "seconds": seconds, "setup_seconds": start - began,
        "sample_steps_per_second": throughput,
        "one_cell_per_process_plateau": sharing, "h100_one_cell_per_process_plateau": recorded,
        "over_plateau": throughput / sharing if sharing else None,
        "over_h100_plateau": throughput / recorded if recorded and cuda else None,
        "projected_column_seconds": group.get("projected_seconds"),
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else None,
        "failed": failed,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    for name, row in rows.items():
        if "seconds_per_round" in row:
            print(f"{name:11s} {row['seconds_per_round']:8.3f} s a round ({row['own_seconds_per_round']:.3f} own), "
                  f"evaluation {row['evaluation_seconds']:.3f} s ({row['evaluation']}), {row['cell_rounds']} rounds "
                  f"projected {row['projected_cell_seconds'] / 60:.1f} min; {row['sample_steps_per_second']:.0f} "
                  f"sample-steps/s; {row['merged_calls']}/{row['calls']} calls merged ({row['status']})")
        else:
            print(f"{name:11s} {row.get('error')} ({row['status']})")
    column = figures["projected_column_seconds"]
    if "seconds_per_round" in group:
        print(f"the group: {group['seconds_per_round']:.3f} s a round, evaluation {group['evaluation_seconds']:.3f} s "
              f"({group['evaluation']})")
    print(f"the group: {throughput:.0f} sample-steps/s"
          + (f" ({figures['over_plateau']:.2f}x this check's one-cell-per-process plateau)" if sharing else "")
          + (f", {figures['over_h100_plateau']:.2f}x the H100's {recorded:.0f}" if figures["over_h100_plateau"] else "")
          + (f"; the column's {planned[0][0].rounds} rounds projected at {column / 60:.1f} min" if column else ""))
    return 1 if failed or "seconds_per_round" not in group else 0


if __name__ == "__main__":
    sys.exit(main())
