"""Trackers: a cell's per-round metrics, configuration, cell id and protocol labels, streamed to the
experiment trackers researchers watch long runs in (`pflbench run SPEC --tracker KIND`, repeatable).

    tensorboard  event files under DIR/tensorboard/<cell id>/ (no server: `tensorboard --logdir DIR/tensorboard`);
                 the embedded default (`--tracker` alone); extra `pflbench[tensorboard]`
    wandb        Weights & Biases in offline mode (no network, no account): runs under DIR/wandb/, one run
                 per cell with the cell id as its run id (`wandb sync DIR/wandb/offline-run-*` uploads
                 them later); extra `pflbench[wandb]`
    mlflow       MLflow's client on a local file store, DIR/mlruns (experiment "pflbench", one run per
                 cell, tagged `pflbench.cell`), or the store $MLFLOW_TRACKING_URI names; extra
                 `pflbench[mlflow]`

DIR is `--tracker-dir`, by default the results store. None of the packages is required: a kind whose
package is missing is refused before anything runs (`problems`), naming the extra to install.

What is logged, against the round as the step (accuracies in %; the names carry the protocol, as the
reports' protocols do, protocols.py), as the cell runs — from the rows the round loop's `on_round`
callback hands over, the same rows the cell's result will hold:

- after every round: `communication/mb_down`, `communication/mb_up`, `time/round_s`;
- at every evaluation round: `accuracy/delivered-clients` (each client's model as delivered, test
  accuracy, mean over clients), `val_accuracy/delivered-clients` (the same on the validation split),
  `accuracy/adapted-clients` (after the cell's local adaptation), `accuracy/{delivered,adapted}-worst10`,
  `accuracy/delivered-pooled`, `loss/{delivered,adapted}-clients` — each where the cell has it;
- when the cell ends: its final numbers under every protocol it has, `final/<protocol>` (e.g.
  `final/adapted-final-clients`), and its status;
- once, at the start: the cell's configuration (flattened: `cell.lr`, `cell.hp.mu`, ...), its id
  (`cell_id`: the hash that names its folder in the store) and what each metric name means
  (`metrics.<name>`: the protocol label).

Runs are the cell's: a resumed cell (continued from its round checkpoint, on Ray or in-process) continues
the same run — the same TensorBoard log folder (a purge at the first round logged again drops what the
killed run had logged past its checkpoint), the same W&B run id (`resume="allow"`; offline, each attempt
is a folder of the same run, merged by `wandb sync`), the same MLflow run (found by its tag) — with the
steps continuing from the checkpoint's round. A tracker that fails never fails the cell: it is noted
("tracker wandb stopped: ...") and the cell goes on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from pflbench.simulator.metrics import accuracy_key

if TYPE_CHECKING:
    from pflbench.config import CellConfig
    from pflbench.api_types import CellResult

KINDS = ("tensorboard", "wandb", "mlflow")
DEFAULT_KIND = "tensorboard"
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # what each imports
PROJECT = "pflbench"
CELL_TAG = "pflbench.cell"

# The final numbers: protocol name (pflbench.reports.protocols) -> summary key (pflbench.simulator.metrics).
FINAL_KEYS = {
    f"{model}-{selection}-{averaging}": accuracy_key(selection, model == "adapted", averaging)
    for selection in ("final", "bestval")
    for model in ("delivered", "adapted")
    for averaging in ("clients", "pooled", "worst10")
} | {"delivered-besttest-clients": accuracy_key("besttest")}
LABELS = {
    "accuracy/delivered-clients": "test accuracy (%), each client's model as delivered, mean over clients",
    "val_accuracy/delivered-clients": "validation accuracy (%), each client's model as delivered, mean over clients",
    "accuracy/adapted-clients": "test accuracy (%) after local adaptation, mean over clients",
    "accuracy/delivered-worst10": "test accuracy (%) as delivered, worst 10% of clients",
    "accuracy/adapted-worst10": "test accuracy (%) after local adaptation, worst 10% of clients",
    "accuracy/delivered-pooled": "test accuracy (%) as delivered, pooled over test samples",
    "loss/delivered-clients": "test loss as delivered, mean over clients",
    "loss/adapted-clients": "test loss after local adaptation, mean over clients",
    "communication/mb_down": "MB sent to the clients in the round",
    "communication/mb_up": "MB sent by the clients in the round",
    "time/round_s": "wall-clock seconds of the round",
    "final/PROTOCOL": "the cell's final number under that evaluation protocol (%), e.g. adapted-final-clients",
}


@dataclass(frozen=True)
class TrackerOptions:
    """Which trackers a run streams to (`kinds`, in KINDS) and where they write (`dir`: None, the
    results store)."""

    kinds: tuple[str, ...] = ()
    dir: Path | None = None

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"tracker {', '.join(map(repr, unknown))}: allowed {', '.join(KINDS)}")
        if len(set(self.kinds)) != len(self.kinds):
            object.__setattr__(self, "kinds", tuple(dict.fromkeys(self.kinds)))

    def folder(self, results: Path) -> Path:
        return Path(self.dir if self.dir is not None else results).absolute()


def problems(kinds: tuple[str, ...] | list[str]) -> list[str]:
    """Why some of `kinds` cannot stream here: an unknown kind, or its package not installed."""
    found = []
    for kind in kinds:
        if kind not in KINDS:
            found.append(f"--tracker {kind}: unknown; allowed {', '.join(KINDS)}")
        elif importlib.util.find_spec(PACKAGES[kind]) is None:
            found.append(
                f"--tracker {kind}: the package {PACKAGES[kind]} is not installed here; pip install 'pflbench[{kind}]'"
            )
    return found


def flat_config(cell: CellConfig, cell_id: str) -> dict[str, Any]:
    """The cell's configuration flattened (`cell.lr`, `cell.hp.mu`), its id and the metrics' labels."""
    from pflbench.storage.store import flatten

    config = {f"cell.{k}": v for k, v in flatten(cell.model_dump(mode="json")).items()}
    return {"cell_id": cell_id, **config, **{f"metrics.{name}": label for name, label in LABELS.items()}}


# ---- the backends: each opens lazily at the first round it logs, knows that round ------------------


class Backend:
    kind = ""

    def open(self, first_round: int) -> None: ...
    def log(self, step: int, values: dict[str, float]) -> None: ...
    def close(self, status: str) -> None: ...


class TensorBoard(Backend):
    kind = "tensorboard"

    def __init__(self, folder: Path, cell_id: str, config: dict[str, Any]) -> None:
        self.path, self.cell_id, self.config = folder / "tensorboard" / cell_id, cell_id, config
        self.writer: Any = None  # a SummaryWriter once open

    def open(self, first_round: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: what an earlier attempt logged from this round on (past its checkpoint) is dropped
        self.writer = SummaryWriter(str(self.path), purge_step=first_round)
        text = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in self.config.items())
        self.writer.add_text("config", text, global_step=first_round)

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.add_text("status", status)
            self.writer.close()


class WandB(Backend):
    kind = "wandb"

    def __init__(self, folder: Path, cell_id: str, config: dict[str, Any], name: str) -> None:
        self.folder, self.cell_id, self.config, self.name = folder, cell_id, config, name
        self.run: Any = None  # a wandb Run once open

    def open(self, first_round: int) -> None:
        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            mode="offline",
            dir=str(self.folder),
            id=self.cell_id,
            resume="allow",
            project=PROJECT,
            name=self.name,
            config=self.config,
            reinit="create_new",
            settings=wandb.Settings(
                console="off",
                silent=True,
                x_disable_stats=True,
                disable_git=True,
                save_code=False,
                x_save_requirements=False,
            ),
        )
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"round": step, **values})

    def close(self, status: str) -> None:
        if self.run is not None:
            self.run.summary["status"] = status
            self.run.finish(exit_code=0 if status in ("finished", "diverged") else 1)


class MLflow(Backend):
    kind = "mlflow"

    def __init__(self, folder: Path, cell_id: str, config: dict[str, Any], name: str) -> None:
        self.folder, self.cell_id, self.config, self.name = folder, cell_id, config, name
        self.client: Any = None  # an MlflowClient once open
        self.run_id: str | None = None

    def uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or (self.folder / "mlruns").as_uri()

    def open(self, first_round: int) -> None:
        uri = self.uri()
        if uri.startswith("file:"):  # MLflow 3 keeps its file store only on request; it is this tracker's default
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(PROJECT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(PROJECT)
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{CELL_TAG}` = '{self.cell_id}'", max_results=1
        )
        if found:  # the cell ran before (killed, resumed): its run goes on
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {CELL_TAG: self.cell_id, **{k: str(v) for k, v in self.config.items() if k.startswith("metrics.")}}
        self.run_id = self.client.create_run(experiment_id, tags=tags, run_name=self.name).info.run_id
        params = [
            Param(k, json.dumps(v) if not isinstance(v, str) else v)
            for k, v in self.config.items()
            if not k.startswith("metrics.")
        ]
        for start in range(0, len(params), 100):
            self.client.log_batch(
                self.run_id,
                params=params[start : start + 100],
                tags=[RunTag("mlflow.note.content", f"pflbench cell {self.cell_id}")] if not start else [],
            )

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self, status: str) -> None:
        if self.client is None:
            return
        self.client.set_tag(self.run_id, "pflbench.status", status)
        self.client.set_terminated(self.run_id, "FINISHED" if status in ("finished", "diverged") else "FAILED")


# ---- one cell's tracking -------------------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class CellTracking:
    """The trackers of one cell: `on_round` for the round loop's callback, `finish` with its result.
    A backend that raises is stopped and noted; the cell never sees the error."""

    def __init__(
        self, cell: CellConfig, options: TrackerOptions, results: Path, note: Callable[[str], None] | None = None
    ) -> None:
        from pflbench.config import cell_hash

        self.cell_id = cell_hash(cell)
        self.cell = cell
        self.note = note or (lambda text: None)
        folder = options.folder(results)
        config = flat_config(cell, self.cell_id)
        name = f"{cell.algorithm} {cell.dataset} {cell.partition} {cell.clients}c s{cell.seed} {self.cell_id}"
        make = {
            "tensorboard": lambda: TensorBoard(folder, self.cell_id, config),
            "wandb": lambda: WandB(folder, self.cell_id, config, name),
            "mlflow": lambda: MLflow(folder, self.cell_id, config, name),
        }
        self.backends: list[Backend] = [make[kind]() for kind in options.kinds]
        self.opened = False
        self.first_round: int | None = None

    def _each(self, what: str, call: Callable[[Backend], None]) -> None:
        for backend in list(self.backends):
            try:
                call(backend)
            except Exception as error:  # a tracker must never fail the cell
                self.backends.remove(backend)
                self.note(
                    f"tracker {backend.kind} stopped ({what}): {type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''}"
                )

    def _open(self, first_round: int) -> None:
        if not self.opened:
            self.opened, self.first_round = True, first_round
            self._each("opening", lambda b: b.open(first_round))

    def on_round(self, info: dict) -> None:
        """The round loop's report after a round ({round, rounds, round_row, client_rows, ...}): the
        round's values, logged now."""
        rnd = int(info.get("round") or 0)
        if rnd < 1:
            return
        self._open(rnd)
        values = round_values(info.get("client_rows") or [], info.get("round_row") or {})
        if values:
            self._each(f"round {rnd}", lambda b: b.log(rnd, values))

    def finish(self, result: CellResult) -> None:
        """The cell's final numbers, then close every run."""
        self._open(self.first_round or 1)
        step, final = self.final(result)
        if final:
            self._each("final numbers", lambda b: b.log(step, final))
        self._each("closing", lambda b: b.close(result.status))

    def final(self, result: CellResult) -> tuple[int, dict[str, float]]:
        """(the last round, {final/<protocol>: the cell's number in %}) from its summary."""
        summary = result.summary or {}
        final = {
            f"final/{name}": v * 100 for name, key in FINAL_KEYS.items() if (v := _finite(summary.get(key))) is not None
        }
        return int(_finite(summary.get("rounds_completed")) or 0), final


def round_values(client_rows: list[dict], round_row: dict) -> dict[str, float]:
    """A round's tracked values: its communication and time (`round_row`, a row of the result's rounds
    table) and, at an evaluation round, the trained clients' accuracies and losses (`client_rows`, its
    rows of the metrics table; a newcomer's rows are not the trained clients')."""
    values: dict[str, float] = {}
    for name, key, scale in (
        ("communication/mb_down", "bytes_down", 1e-6),
        ("communication/mb_up", "bytes_up", 1e-6),
        ("time/round_s", "wall_time", 1.0),
    ):
        if (v := _finite(round_row.get(key))) is not None:
            values[name] = v * scale
    rows = [row for row in client_rows if not row.get("newcomer")]
    if not rows:
        return values
    for model in ("delivered", "adapted"):
        suffix = "_adapted" if model == "adapted" else ""
        scored = [_finite(row.get(f"accuracy{suffix}")) for row in rows]
        accuracy = [a for a in scored if a is not None]
        if len(accuracy) < len(scored):  # not scored this way (no adaptation), or a model that diverged when adapted
            continue
        values[f"accuracy/{model}-clients"] = math.fsum(accuracy) / len(accuracy) * 100
        worst = sorted(accuracy)[: max(1, math.ceil(0.1 * len(accuracy)))]
        values[f"accuracy/{model}-worst10"] = math.fsum(worst) / len(worst) * 100
        losses = [loss for row in rows if (loss := _finite(row.get(f"loss{suffix}"))) is not None]
        if len(losses) == len(rows):
            values[f"loss/{model}-clients"] = math.fsum(losses) / len(losses)
        if model == "delivered":
            weights = [_finite(row.get("test_samples")) or 0.0 for row in rows]
            if sum(weights) > 0:
                values["accuracy/delivered-pooled"] = (
                    math.fsum(a * w for a, w in zip(accuracy, weights)) / math.fsum(weights) * 100
                )
    validation = [v for row in rows if (v := _finite(row.get("val_accuracy"))) is not None]
    if len(validation) == len(rows):
        values["val_accuracy/delivered-clients"] = math.fsum(validation) / len(validation) * 100
    return values


def cell_tracking(
    cell: CellConfig, options: TrackerOptions, results: Path, note: Callable[[str], None] | None = None
) -> CellTracking | None:
    """The tracking of one cell (None when no tracker is asked for)."""
    if not options.kinds:
        return None
    return CellTracking(cell, options, results, note)
