"""How a cell runs, as opposed to what it computes: the execution options.

One small object, standard library only (the command-line parsers build their choices from it without
importing torch), passed from `pflbench run`, `pflbench sweep` and `pflbench bench` down to the
Federation. None of these options is part of a cell's identity (`pflbench.config.cell_hash`): they
change how fast a cell runs, never what it computes beyond float rounding.

- `client_batching`: local training batched across clients (torch.func) or a loop over clients.
  `auto` batches on CUDA: on a CPU a loop over clients at batch 32 is as fast as one big batch and
  avoids vmap's overhead (measured with `pflbench bench`).
- `compiled_training`: torch.compile of forward+backward+SGD (pflbench.simulator.training's module doc). `auto`
  is the eager step: with channels-last convolutions and client threads the eager loop path trains the
  CNN faster than the compiled step on a CPU (pflbench bench, 2 threads: 7,631 vs 5,877 samples/s on
  Fashion-MNIST's shape); CUDA was not measured.
- `channels_last`: convolutions in NHWC memory order. `auto`: on for convolutional models on a CPU,
  where oneDNN's channels-last kernels train the CNN 1.3-1.5x faster; off on CUDA (not measured there).
- `client_threads`: the loop path trains and evaluates clients side by side on the cell's CPU threads,
  one intra-op thread each. `auto`: on for a CPU with more than one torch thread; off on CUDA.
- `cell_groups`: cells that share a model architecture run as a cell group in one process, their
  concurrent local training one batched step (pflbench.simulator.groups). `auto`: on CUDA, where a step is host
  overhead and a wider one costs little more; off on a CPU, whose default client loop has nothing to
  merge (`on` forms groups there too). Grouping changes no number of a cell beyond float rounding (the
  batched step's: bit for bit on a CPU, tests/test_cell_groups.py). On Ray a group is one task, with one
  cell's CPUs and the cells' GPU fractions summed up to one GPU (`pflbench.simulator.groups.group_resources`).
- `cuda_graphs`: the batched plain local step through static buffers (pflbench.simulator.static_step), and the
  methods' own steps (pFedMe, Per-FedAvg, pFedHN's official inner optimizer: pflbench.kit.steps.run_steps):
  captured once per shape as a CUDA graph and replayed on CUDA, called eagerly on a CPU (where they give
  the eager steps' numbers bit for bit, tests/test_static_step.py, tests/test_captured_steps.py). `auto`: off until the GPU check's
  `graphs` step has shown graphs on and off equal on a device (`CUDA_GRAPHS_VERIFIED`), then on CUDA;
  `on` uses the static step on any device (on a CPU only to test it: it is no faster there).
- `device`: torch device (None: "cuda" for cells given GPUs, else "cpu"; decided by the runner).
- `threads`: torch threads of the cell (None: the runner sets them from the cell's CPUs).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: at run time this module imports the standard library alone
    import torch

CLIENT_BATCHING = ("auto", "on", "off")
COMPILED_TRAINING = ("auto", "on", "off")
CHANNELS_LAST = ("auto", "on", "off")
CLIENT_THREADS = ("auto", "off")
CELL_GROUPS = ("auto", "on", "off")
CUDA_GRAPHS = ("auto", "on", "off")
CHOICES = {
    "client_batching": CLIENT_BATCHING,
    "compiled_training": COMPILED_TRAINING,
    "channels_last": CHANNELS_LAST,
    "client_threads": CLIENT_THREADS,
    "cell_groups": CELL_GROUPS,
    "cuda_graphs": CUDA_GRAPHS,
}
# Whether `cuda_graphs: auto` turns the captured steps on for CUDA: set once a device has shown graphs on and
# off equal (benchmarks/gpu/check.py's `graphs` step: the plain step, the column, the methods' own steps);
# until then `auto` is off everywhere.
CUDA_GRAPHS_VERIFIED = False


@dataclass(frozen=True)
class ExecutionOptions:
    device: str | None = None
    client_batching: str = "auto"
    compiled_training: str = "auto"
    channels_last: str = "auto"
    client_threads: str = "auto"
    threads: int | None = None
    cell_groups: str = "auto"
    cuda_graphs: str = "auto"

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads!r}")

    def on(self, device: str) -> ExecutionOptions:
        """These options with the device decided (kept where one was given)."""
        return self if self.device else ExecutionOptions(**{**asdict(self), "device": device})

    # -- the engine's choices, given the device and the models (each documented in the module doc) --
    def batched(self, device: torch.device, algorithm_batched: bool) -> bool:
        if not algorithm_batched:
            return False
        if self.client_batching == "auto":
            return device.type == "cuda"
        return self.client_batching == "on"

    def compiled(self) -> bool:
        return self.compiled_training == "on"

    def use_channels_last(self, device: torch.device, has_conv: bool) -> bool:
        wanted = device.type == "cpu" if self.channels_last == "auto" else self.channels_last == "on"
        return wanted and has_conv

    def grouped(self, device: torch.device | str) -> bool:
        """Whether cells run as cell groups on `device` (a torch device or its type's name)."""
        if self.cell_groups == "auto":
            return getattr(device, "type", str(device).split(":")[0]) == "cuda"
        return self.cell_groups == "on"

    def static_step(self, device: torch.device | str) -> bool:
        """Whether the batched plain step runs through static buffers (a CUDA graph on CUDA) on `device`."""
        if self.cuda_graphs == "auto":
            return CUDA_GRAPHS_VERIFIED and getattr(device, "type", str(device).split(":")[0]) == "cuda"
        return self.cuda_graphs == "on"

    def side_by_side(self, device: torch.device, torch_threads: int) -> int:
        """How many clients the loop path runs side by side (1: one after another)."""
        return torch_threads if self.client_threads == "auto" and device.type == "cpu" else 1


def add_execution_arguments(parser: argparse.ArgumentParser, *, device_help: str, cell_groups: bool = False) -> None:
    """The execution options as command-line arguments (`run`, `sweep`; `cell_groups`: `run` only)."""
    parser.add_argument("--device", help=device_help)
    parser.add_argument(
        "--client-batching",
        choices=CLIENT_BATCHING,
        default="auto",
        help="local training batched across clients (auto: on CUDA, a client loop on CPU)",
    )
    parser.add_argument(
        "--compiled-training",
        choices=COMPILED_TRAINING,
        default="auto",
        help="torch.compile the local training step (auto: the eager step, measured faster on "
        "CPU with channels-last and client threads; on: compiled)",
    )
    parser.add_argument(
        "--channels-last",
        choices=CHANNELS_LAST,
        default="auto",
        help="convolutions in channels-last memory order (auto: on CPU)",
    )
    parser.add_argument(
        "--client-threads",
        choices=CLIENT_THREADS,
        default="auto",
        help="train and evaluate a cell's clients side by side on its CPU threads, one torch "
        "thread each (auto: on CPU when the cell has more than one thread)",
    )
    if cell_groups:
        parser.add_argument(
            "--cell-groups",
            choices=CELL_GROUPS,
            default="auto",
            help="run cells that share a model architecture as cell groups in one process, their "
            "local training one batched step; on Ray one task per group (auto: on CUDA)",
        )
    parser.add_argument(
        "--cuda-graphs",
        choices=CUDA_GRAPHS,
        default="auto",
        help="the batched local step captured as a CUDA graph and replayed (on: on CUDA, and "
        "the same static-buffer step run eagerly on a CPU; auto: off until verified on a GPU)",
    )


def execution_options(args: argparse.Namespace) -> ExecutionOptions:
    """The ExecutionOptions given on a command line built with `add_execution_arguments`."""
    return ExecutionOptions(
        device=args.device,
        client_batching=args.client_batching,
        compiled_training=args.compiled_training,
        channels_last=args.channels_last,
        client_threads=args.client_threads,
        cell_groups=getattr(args, "cell_groups", "auto"),
        cuda_graphs=getattr(args, "cuda_graphs", "auto"),
    )
