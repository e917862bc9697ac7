"""The batched local step captured as a CUDA graph (pflbench.simulator.static_step) against the eager step, on the device:
equal, and how much faster.

Three parts, each on the same starting state with the option off and on:
- `step`: the Fashion-MNIST CNN's batched plain step at `--widths` rows (10: one 10-client cell; 70: the
  column's seven plain rows as one cell group; 100), batch `--batch`, one call of `--steps` steps a client
  (a row with fewer steps at the tail: a straggler). Per width: max |diff| of the trained parameters and the
  mean losses between the eager and the static step, whether they are equal to the bit; seconds per step
  (CUDA events around the call, over its steps; the median of `--repeats` calls after a warm-up call, which
  captures), the sample-steps/s (rows x batch / seconds per step) of each, their ratio, the capture's seconds.
- `column`: Table 1's Fashion-MNIST 10-client column's plain rows (`--rows`; seed 0, the paper's settings
  unless `--samples`/`--epochs` shrink them) as one cell group (`pflbench.simulator.groups.run_group`, the batched
  path), `--rounds` rounds with an evaluation at the last, once with `cuda_graphs` off and once on: per row
  max |diff| of the evaluated losses and accuracies (test and validation, every client), and the group's
  seconds (all rounds, data prepared beforehand) of each.
- `own`: the methods' own steps (pflbench.kit.steps.run_steps: pFedMe's inner solve, Per-FedAvg's meta step,
  pFedHN's official inner optimizer) in Table 1's Fashion-MNIST 10-client column's cells (`--own-rows`; the
  paper's settings at `--own-epochs` local epochs, `--samples` as for the column): one round's local training
  of the column's width (its 10 clients; pFedHN: one client, as its per-client server updates train them),
  eager and over static buffers: max |diff| of what it returns (pFedMe: and theta), whether it is equal to
  the bit, milliseconds per step of each (CUDA events around the call, the median of `--own-repeats` calls after
  a warm-up call, the static one capturing) and their ratio.
On a CPU (the rehearsal) nothing is captured: the static step runs eagerly (the "replay" is a call), the
figures say "no CUDA: capture not exercised", and the two must agree to the bit (tests/test_static_step.py).

    python benchmarks/gpu/graphs.py --device cuda --json graphs.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the scripts beside this one (PYTHONSAFEPATH leaves the script's folder out)
from column_groups import column_cells  # noqa: E402
from timing import seconds_per_step  # noqa: E402

PLAIN_ROWS = ["local", "fedavg", "fedbn", "pfedla", "heurpfedla", "fedrep", "fedfomo"]

# The acceptance rule for pflbench.simulator.execution.CUDA_GRAPHS_VERIFIED, set before any device has judged it
# (benchmarks/gpu/PLAN.md says why): bit-identical, no tolerance.
RULE = ("CUDA_GRAPHS_VERIFIED may become True only from a run on a CUDA device in which every comparison of this "
        "script is bit-identical (max |diff| exactly 0: the plain step at every width, every row of the column in "
        "losses and accuracies, every method's own steps), every static step was captured as a CUDA graph (none "
        "fell back to eager), no part failed and every row finished. Anything else, however small the difference, "
        "leaves it False: the graph replays the eager step's kernels on the same buffers, so a difference means "
        "other kernels or a race, and checkpoints resume across the two paths only if they are the same path.")


def verdict(figures: dict, cuda: bool) -> dict:
    """RULE applied to this script's figures: verified or not, and every reason why not."""
    reasons = [] if cuda else ["no CUDA device: capture not exercised"]
    reasons += [f"{key}: {figures[key]}" for key in ("step_error", "column_error", "own_error") if key in figures]
    for part in ("step", "column", "own"):
        if part not in figures and f"{part}_error" not in figures:
            reasons.append(f"{part}: not run")
    for width, f in figures.get("step", {}).items():
        if not f.get("bit_identical"):
            reasons.append(f"step at {width} rows: not bit-identical (params {f.get('max_abs_diff_params')}, "
                           f"losses {f.get('max_abs_diff_losses')})")
        if cuda and not f.get("captured"):
            reasons.append(f"step at {width} rows: not captured")
    for row, f in figures.get("column", {}).get("rows", {}).items():
        if any(status != "finished" for status in f.get("status", [])):
            reasons.append(f"column {row}: {f.get('status')}")
        differing = [k[:-len("_bit_identical")] for k, v in f.items() if k.endswith("_bit_identical") and not v]
        if differing:
            reasons.append(f"column {row}: not bit-identical in {', '.join(differing)}")
    for row, f in figures.get("own", {}).items():
        if not f.get("bit_identical"):
            reasons.append(f"own steps of {row}: not bit-identical (max |diff| {f.get('max_abs_diff')})")
        if cuda and not f.get("captured"):
            reasons.append(f"own steps of {row}: not captured")
    return {"verified": not reasons, "reasons": reasons, "rule": RULE}


def eager_and_static(call, steps: int, repeats: int, cuda: bool) -> tuple:
    """`call(static)` makes `steps` steps eagerly (False) or over static buffers (True): the eager result,
    the static one (its first call captures on CUDA), that first call's seconds, and the median seconds
    per step of `repeats` timed calls of each."""
    eager_result = call(False)
    began = time.perf_counter()
    static_result = call(True)
    if cuda:
        import torch

        torch.cuda.synchronize()
    first_call = time.perf_counter() - began
    eager = statistics.median(seconds_per_step(lambda: call(False), steps, cuda) for _ in range(repeats))
    static = statistics.median(seconds_per_step(lambda: call(True), steps, cuda) for _ in range(repeats))
    return eager_result, static_result, first_call, eager, static


def largest_difference(a: dict, b: dict) -> float:
    """max |a - b| over the floating tensors of two states (inf where a NaN or inf differs)."""
    import torch

    worst = 0.0
    for name, t in a.items():
        if t.is_floating_point():
            diff = (t.double() - b[name].double()).abs()
            worst = max(worst, float(diff.nan_to_num(float("inf")).max()) if diff.numel() else 0.0)
        elif not torch.equal(t, b[name]):
            worst = float("inf")
    return worst


def bit_identical(a: dict, b: dict) -> bool:
    """Whether two states hold the same bits (NaNs and signed zeros included)."""
    import torch

    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}

    def raw(t):
        return t.view(bits[t.element_size()]) if t.is_floating_point() else t

    return a.keys() == b.keys() and all(a[n].shape == b[n].shape and a[n].dtype == b[n].dtype
                                        and torch.equal(raw(a[n]), raw(b[n])) for n in a)


def step_part(device: str, widths: list[int], batch: int, steps: int, repeats: int) -> dict:
    import torch

    from pflbench.simulator.models import build_model
    from pflbench.simulator.client_model import ClientModel
    from pflbench.simulator.training import SGD, train_group, batch_plan, cross_entropy

    cuda = device.startswith("cuda")
    model = ClientModel(build_model("cnn", (1, 28, 28), 10))
    model.channels_last = not cuda  # the engine's layout on the device (channels-last on a CPU)
    figures: dict = {}
    for width in widths:
        gen = torch.Generator().manual_seed(width)
        per_client = steps * batch
        features = torch.randn(width * per_client, 1, 28, 28, generator=gen).to(device)
        if model.channels_last:
            features = features.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 10, (width * per_client,), generator=gen).to(device)
        indices = [torch.arange(k * per_client, (k + 1) * per_client, device=device) for k in range(width)]
        sizes = [per_client] * (width - 1) + [per_client // 2]  # the last row a straggler: half the steps
        plans = batch_plan(sizes, batch, 1, None, [torch.Generator().manual_seed(k) for k in range(width)])
        state = {n: t + 0.01 * torch.randn(t.shape, generator=gen).to(device) if t.is_floating_point() else t
                 for n, t in model.init(width, 0, device).items()}
        trainable = set(model.param_names)
        sgd = SGD(0.005)

        def call(static: bool) -> tuple:
            return train_group(model, state, features, labels, indices, plans, sgd, cross_entropy, {}, trainable,
                                static=static)

        eager_result, static_result, first_call, eager, static = eager_and_static(call, steps, repeats, cuda)
        same = (all(torch.equal(eager_result[0][n], static_result[0][n]) for n in state)
                and torch.equal(eager_result[1], static_result[1]))
        [static_step] = model.static_steps.values()
        model.static_steps.clear()  # the next width's buffers and graph only
        figures[str(width)] = {
            "rows": width, "batch": batch, "steps": steps,
            "max_abs_diff_params": largest_difference(eager_result[0], static_result[0]),
            "max_abs_diff_losses": float((eager_result[1] - static_result[1]).abs().max()),
            "bit_identical": same, "captured": static_step.graph is not None,
            "first_static_call_seconds": first_call,
            "eager_seconds_per_step": eager, "static_seconds_per_step": static,
            "eager_sample_steps_per_second": width * batch / eager,
            "static_sample_steps_per_second": width * batch / static,
            "speedup": eager / static}
    return figures


def column_part(device: str, rows: list[str], rounds: int, samples: int | None, epochs: int | None) -> dict:
    import numpy as np
    import torch

    from pflbench.simulator import groups
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.resolve import resolve
    from pflbench.simulator.rounds import prepare_cell

    cells = [resolve(cell) for cell, _ in column_cells(rows, 10, rounds, "timed", samples, epochs)]
    for cell in cells:  # decoded, partitioned and cached before the clock starts
        prepare_cell(cell)
    runs, seconds = {}, {}
    for graphs in ("off", "on"):
        began = time.perf_counter()
        runs[graphs] = groups.run_group(cells, execution=ExecutionOptions(device=device, client_batching="on",
                                                                          cuda_graphs=graphs), stop_after=rounds)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds[graphs] = time.perf_counter() - began
    per_row: dict = {}
    for cell, off, on in zip(cells, runs["off"].results, runs["on"].results):
        row: dict = {"status": [off.status, on.status]}
        for column in ("loss", "accuracy", "val_loss", "val_accuracy"):
            if column in off.metrics and len(off.metrics) and len(off.metrics) == len(on.metrics):
                a, b = off.metrics[column].to_numpy(float), on.metrics[column].to_numpy(float)
                both = ~(np.isnan(a) & np.isnan(b))
                row[f"max_abs_diff_{column}"] = float(np.abs(a[both] - b[both]).max()) if both.any() else 0.0
                row[f"{column}_bit_identical"] = bool(np.array_equal(a, b, equal_nan=True))
        per_row[cell.algorithm] = row
    return {"rows": per_row, "rounds": rounds, "seconds_off": seconds["off"], "seconds_on": seconds["on"],
            "speedup": seconds["off"] / seconds["on"] if seconds["on"] else None,
            "samples_per_client": cells[0].partition_params.get("samples_per_client"),
            "local_epochs": cells[0].local_epochs}


OWN_ROWS = ["pfedme", "perfedavg", "pfedhn"]


def own_part(device: str, rows: list[str], repeats: int, samples: int | None, epochs: int,
             inner_steps: int | None) -> dict:
    import torch

    from pflbench.algorithm import get_algorithm
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.federation import Federation
    from pflbench.simulator.resolve import resolve
    from pflbench.simulator.rounds import prepare_cell, with_server

    cuda = device.startswith("cuda")
    figures: dict = {}
    for cell, _ in column_cells(rows, 10, 1, "timed", samples, None):
        if cell.algorithm == "pfedhn":  # its official inner optimizer (the method's own steps)
            cell = cell.model_copy(update={"hp": {**cell.hp, "inner_optimizer": "official",
                                                  **({"inner_steps": inner_steps} if inner_steps else {})}})
        cell = resolve(cell.model_copy(update={"local_epochs": epochs}))
        dataset, splits = prepare_cell(cell)
        fed = Federation(cell, dataset, splits, ExecutionOptions(device=device, client_batching="on"))
        method = get_algorithm(cell.algorithm)
        alg = method(fed, method.parse_hyperparams(cell.hp))
        alg.setup()
        clients = torch.arange(fed.num_clients, device=fed.device)
        context = fed.round(1, clients)
        download = alg.configure(context)
        context = with_server(alg, fed, context.with_download(download))
        state = alg.receive(context, download)
        if cell.algorithm == "pfedhn":
            one = {n: t[:1] for n, t in state.items()}
            width, steps = 1, alg.hp.inner_steps or 1

            def train() -> dict:
                return alg.inner_train(context, clients[:1], one)
        else:
            width, steps = len(clients), max(len(p) for p in fed.local_plans(context, clients))

            def train() -> dict:
                out = dict(alg.local_train(context, state))
                for n, t in getattr(alg, "personal_state", {}).items():  # pFedMe's theta
                    out[f"theta.{n}"] = t.clone()
                return out

        def call(static: bool) -> dict:
            fed.static_step = static
            return train()

        eager_result, static_result, first_call, eager, static = eager_and_static(call, steps, repeats, cuda)
        same = bit_identical(eager_result, static_result)
        made = [step for key, step in fed.model.static_steps.items() if key[0] == "own step"]
        figures[cell.algorithm] = {
            "rows": width, "batch": cell.batch_size, "steps": steps, "local_epochs": cell.local_epochs,
            "max_abs_diff": largest_difference(eager_result, static_result), "bit_identical": same,
            "captured": bool(made) and made[0].graph is not None, "first_static_call_seconds": first_call,
            "eager_ms_per_step": eager * 1e3, "static_ms_per_step": static * 1e3, "speedup": eager / static}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--widths", default="10,70,100", help="rows of the timed step, comma-separated")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=50, help="steps of a timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default=",".join(PLAIN_ROWS), help="the column's rows (plain-step rows)")
    parser.add_argument("--rounds", type=int, default=3, help="the column's rounds, the last evaluated")
    parser.add_argument("--samples", type=int, default=None, help="samples per client (default: the spec's)")
    parser.add_argument("--epochs", type=int, default=None, help="local and adaptation epochs (default: the spec's)")
    parser.add_argument("--own-rows", default=",".join(OWN_ROWS), help="methods whose own steps are timed ('': none)")
    parser.add_argument("--own-epochs", type=int, default=1, help="local epochs of the own steps' round")
    parser.add_argument("--own-repeats", type=int, default=3, help="timed calls of each method's own steps")
    parser.add_argument("--own-inner-steps", type=int, default=None, help="pFedHN's inner steps (default: the cell's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import torch

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("graphs: torch sees no CUDA device", file=sys.stderr)
        return 3
    figures: dict = {"device": args.device, "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name(0) if cuda else None,
                     "capture": "CUDA graphs" if cuda else "no CUDA: capture not exercised (the static step eagerly)",
                     "tf32_convolutions": torch.backends.cudnn.allow_tf32 if cuda else None}
    failed = False
    parts = [("step", lambda: step_part(args.device, [int(w) for w in args.widths.split(",")], args.batch, args.steps,
                                        args.repeats)),
             ("column", lambda: column_part(args.device, args.rows.split(","), args.rounds, args.samples, args.epochs))]
    if args.own_rows:
        parts.append(("own", lambda: own_part(args.device, args.own_rows.split(","), args.own_repeats, args.samples,
                                              args.own_epochs, args.own_inner_steps)))
    for name, part in parts:
        try:
            figures[name] = part()
        except Exception as error:  # recorded; the next part still runs
            figures[f"{name}_error"] = f"{type(error).__name__}: {error}"
            failed = True
        if args.json:  # after every part: a step cut short by its box keeps what it measured
            Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    figures["verdict"] = verdict(figures, cuda)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    print(figures["capture"])
    for width, f in figures.get("step", {}).items():
        print(f"step at {width:>3} rows: eager {f['eager_seconds_per_step'] * 1e3:.3f} ms, static "
              f"{f['static_seconds_per_step'] * 1e3:.3f} ms ({f['speedup']:.2f}x; "
              f"{f['static_sample_steps_per_second']:.0f} sample-steps/s); max |diff| params "
              f"{f['max_abs_diff_params']:.3g}, losses {f['max_abs_diff_losses']:.3g}; bit-identical {f['bit_identical']}")
    column = figures.get("column")
    if column:
        print(f"column ({len(column['rows'])} rows, {column['rounds']} rounds): off {column['seconds_off']:.2f} s, "
              f"on {column['seconds_on']:.2f} s ({column['speedup']:.2f}x)")
        for name, row in column["rows"].items():
            print(f"  {name:11s} {row}")
    for name, f in figures.get("own", {}).items():
        print(f"own steps of {name:9s} at {f['rows']:>2} rows: eager {f['eager_ms_per_step']:.3f} ms, static "
              f"{f['static_ms_per_step']:.3f} ms a step ({f['speedup']:.2f}x); max |diff| {f['max_abs_diff']:.3g}; "
              f"bit-identical {f['bit_identical']}")
    for key in ("step_error", "column_error", "own_error"):
        if key in figures:
            print(f"{key}: {figures[key]}", file=sys.stderr)
    judged = figures["verdict"]
    print(f"verdict: CUDA_GRAPHS_VERIFIED {'may be set True' if judged['verified'] else 'stays False'}"
          + "".join(f"\n  - {reason}" for reason in judged["reasons"]))
    statuses = [s for row in (column or {}).get("rows", {}).values() for s in row["status"]]
    return 1 if failed or any(s != "finished" for s in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())
