"""Convolution forms for the batched CNN step on the device: which one is fastest, and how far each is from a
float64 reference of the same step.

The engine trains K clients' CNNs as one batched step (`pflbench.simulator.batching`, `pflbench.simulator.static_step`); on CUDA
its convolutions are grouped convolutions today. This script times one whole batched training step (forward,
cross-entropy, backward, the SGD update of every row: `pflbench.simulator.static_step.StaticStep._step`, exactly the
engine's step) for each combination of
  model   `cnn` on Fashion-MNIST-shaped input (1x28x28) and `cnn-bn` on CIFAR-shaped input (3x32x32), 10 classes
          (Table 1's two models), at `--widths` rows (10 and 100 clients) and Table 1's batch size
          (benchmarks/table1.yaml, `defaults.batch_size`);
  form    grouped: the clients folded into the channels, one grouped convolution (cuDNN) a layer; in
                   channels-first order this is `pflbench.simulator.batching.StackedConv2d` itself (today's CUDA path);
          unfold:  im2col per client, then one batched matmul (`bmm`) over the clients: the convolution as GEMMs;
          loop:    one ordinary cuDNN convolution per client (`StackedConv2d` unfolded), on CUDA only captured
                   (eager it is hundreds of launches a step: host time, which the graph is there to remove);
  layout  first (NCHW) or last (NHWC, channels-last): input, activations and weights; BatchNorm keeps the
          order (its clients folded into NHWC channels here; the engine's StackedBatchNorm makes NCHW copies);
  tf32    default: torch's defaults (matmuls in IEEE float32, cuDNN convolutions in TF32: today's engine);
          tf32: both in TF32; ieee: both in IEEE float32 (`torch.backends.cuda.matmul.allow_tf32`,
          `torch.backends.cudnn.allow_tf32`); the unfold form's convolutions are matmuls, the others' cuDNN;
  capture eager (the step's code called) or captured (one CUDA graph of the whole step, replayed);
  cuDNN's algorithm choice by its heuristics (`torch.backends.cudnn.benchmark` off, as the engine runs;
          `--cudnn-benchmark` turns it on for the whole run, recorded in the figures).
The forms (b) unfold and (c) loop live here as measurement code: the engine changes once the device has
said which wins.

Per combination: seconds per step (CUDA events around `--steps` steps, each step first copying the next of
four input batches into the step's buffers, as the engine's gather does; after a warm-up, the median of
`--repeats`), sample-steps/s (rows x batch / seconds), the ratio to the grouped form with everything else
the same (`ratio_to_grouped`) and to today's path (grouped, channels-first, default TF32, eager:
`ratio_to_today`, the engine's default while `cuda_graphs: auto` is off); and its distance from a float64
CPU reference of the same step from the same state and batch (each client's plain module, one at a time,
no batching code): max |diff| of the parameters, of the BatchNorm statistics and of the rows' losses after
one step, the update's relative error ||dp - dp_ref|| / ||dp_ref|| (dp: the parameters' change; in float32
it is bounded below by the parameters' own rounding, ~3e-5 here, so it separates forms only where TF32
makes it larger) and the gradient's ||g - g_ref|| / ||g_ref|| (the form's kernels, called eagerly: a graph
replays the same ones), from which `pflbench.studies.verify`'s cross-device tolerance can be re-measured for the
form kept.

Combinations run in order of importance (default TF32 first, then tf32, then ieee) and none starts after
`--seconds`: a run cut short keeps what it measured, the rest marked `not run (time)`. Figures go to
`--json`; a short table to the log. On a CPU (the GPU check's rehearsal) nothing is captured and TF32 does
not apply: the forms run eagerly at the default setting, and the output says so.

    python benchmarks/gpu/kernels.py --device cuda --json kernels.json
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from pflbench.simulator.batching import StackedBatchNorm, StackedConv2d, StackedLinear
from pflbench.simulator.models import build_model
from pflbench.simulator.row_rates import RowRates
from pflbench.simulator.static_step import StaticStep
from pflbench.simulator.training import SGD

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # timing.py beside this one (PYTHONSAFEPATH leaves the script's folder out)
from timing import seconds_per_step  # noqa: E402
TABLE1 = HERE.parents[1] / "benchmarks" / "table1.yaml"

FORMS = ("grouped", "unfold", "loop")
LAYOUTS = ("first", "last")
# name -> (matmuls in TF32, cuDNN convolutions in TF32)
TF32 = {"default": (False, True), "tf32": (True, True), "ieee": (False, False)}
MODELS = {"cnn": ((1, 28, 28), "Fashion-MNIST"), "cnn-bn": ((3, 32, 32), "CIFAR-10")}
CLASSES = 10
POOL = 4  # input batches the timed steps rotate through (so that no step reads the last one's cache)
WARMUP = 3  # untimed steps before the timed ones (each form's lazy initialization: cuBLAS, cuDNN plans)
LR = 0.005  # Table 1's learning rate for the grey datasets


# ---- the forms: twins of the CNN's layers whose parameters carry a leading client dimension -----------------

def fold_last(x: Tensor, clients: int) -> Tensor:
    """[K*B, C, H, W] -> [B, K*C, H, W] in channels-last memory order (client k's channels in block k)."""
    n, c, h, w = x.shape
    return (x.permute(0, 2, 3, 1).reshape(clients, n // clients, h, w, c).permute(1, 2, 3, 0, 4)
            .reshape(n // clients, h, w, clients * c).permute(0, 3, 1, 2))


def unfold_last(y: Tensor, clients: int) -> Tensor:
    """The inverse of `fold_last`: [B, K*C, H, W] -> [K*B, C, H, W] in channels-last memory order."""
    b, kc, h, w = y.shape
    return (y.permute(0, 2, 3, 1).reshape(b, h, w, clients, kc // clients).permute(3, 0, 1, 2, 4)
            .reshape(clients * b, h, w, kc // clients).permute(0, 3, 1, 2))


class LastGroupedConv2d(StackedConv2d):
    """(a) grouped, channels-last: the clients folded into the channels of an NHWC batch, one grouped
    convolution with NHWC weights."""

    def __init__(self, layer: nn.Conv2d) -> None:
        super().__init__(layer, grouped=True)

    def forward(self, x: Tensor) -> Tensor:
        clients = self.weight.shape[0]
        weight = self.weight.reshape(-1, *self.weight.shape[2:]).to(memory_format=torch.channels_last)
        bias = None if self.bias is None else self.bias.reshape(-1)
        out = F.conv2d(fold_last(x, clients), weight, bias, self.stride, self.padding, self.dilation,
                       self.groups * clients)
        return unfold_last(out, clients)


class UnfoldConv2d(StackedConv2d):
    """(b) unfold + bmm: every client's im2col, then one batched matmul over the clients. Channels-first:
    `F.unfold`, columns [K, C*kh*kw, B*L], out [K, O, B*L]; channels-last: the patches of the NHWC input
    (`Tensor.unfold`), columns [K, B*L, C*kh*kw], out [K, B*L, O], which is the NHWC output itself."""

    def __init__(self, layer: nn.Conv2d, channels_last: bool) -> None:
        super().__init__(layer, grouped=False)
        self.channels_last = channels_last
        if layer.groups != 1 or tuple(layer.dilation) != (1, 1) or isinstance(layer.padding, str):
            raise ValueError("unfold + bmm is written for plain convolutions (groups 1, dilation 1, numeric padding)")
        self.pads = (int(layer.padding[0]), int(layer.padding[1]))

    def forward(self, x: Tensor) -> Tensor:
        clients, out_channels, in_channels, kh, kw = self.weight.shape
        n, _, h, w = x.shape
        batch = n // clients
        (ph, pw), (sh, sw) = self.pads, self.stride
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        weight = self.weight.reshape(clients, out_channels, in_channels * kh * kw)
        if self.channels_last:
            padded = F.pad(x, (pw, pw, ph, ph)) if ph or pw else x
            patches = padded.permute(0, 2, 3, 1).unfold(1, kh, sh).unfold(2, kw, sw)  # [N, Ho, Wo, C, kh, kw]
            columns = patches.reshape(clients, batch * ho * wo, in_channels * kh * kw)
            if self.bias is None:
                out = torch.bmm(columns, weight.transpose(1, 2))
            else:
                out = torch.baddbmm(self.bias.unsqueeze(1), columns, weight.transpose(1, 2))
            return out.reshape(n, ho, wo, out_channels).permute(0, 3, 1, 2)
        columns = F.unfold(x, (kh, kw), padding=self.pads, stride=self.stride)  # [N, C*kh*kw, L]
        columns = columns.reshape(clients, batch, -1, ho * wo).transpose(1, 2).reshape(clients, -1, batch * ho * wo)
        if self.bias is None:
            out = torch.bmm(weight, columns)
        else:
            out = torch.baddbmm(self.bias.unsqueeze(2), weight, columns)  # [K, O, B*L]
        return out.reshape(clients, out_channels, batch, ho, wo).transpose(1, 2).reshape(n, out_channels, ho, wo)


class LastBatchNorm(StackedBatchNorm):
    """StackedBatchNorm keeping channels-last order: the clients folded into the channels of an NHWC batch."""

    def forward(self, x: Tensor) -> Tensor:
        stacked = self.weight if self.weight is not None else self.running_mean
        clients = stacked.shape[0]
        use_batch_stats = self.training or not self.track_running_stats
        updates = self.training and self.track_running_stats
        if updates:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
        flat = (lambda t: t.view(-1)) if updates else (lambda t: t.reshape(-1))
        out = F.batch_norm(
            fold_last(x, clients),
            None if self.running_mean is None else flat(self.running_mean),
            None if self.running_var is None else flat(self.running_var),
            None if self.weight is None else self.weight.reshape(-1),
            None if self.bias is None else self.bias.reshape(-1),
            use_batch_stats, self.momentum, self.eps)
        return unfold_last(out, clients)


def form_twin(module: nn.Module, form: str, layout: str) -> nn.Module:
    """A meta copy of `module` whose Conv2d, Linear and BatchNorm2d layers take stacked parameters, the
    convolutions in `form`, everything in `layout`."""
    if form not in FORMS or layout not in LAYOUTS:
        raise ValueError(f"form must be one of {FORMS} and layout one of {LAYOUTS}, got {form!r}, {layout!r}")
    last = layout == "last"
    twin = copy.deepcopy(module).to("meta")
    for name, child in list(twin.named_modules()):
        new: nn.Module | None
        if type(child) is nn.Conv2d:
            if form == "grouped":
                new = LastGroupedConv2d(child) if last else StackedConv2d(child, grouped=True)
            elif form == "unfold":
                new = UnfoldConv2d(child, last)
            else:
                loop = StackedConv2d(child, grouped=False)
                loop.channels_last = last
                new = loop
        elif type(child) is nn.Linear:
            new = StackedLinear(child)
        elif type(child) is nn.BatchNorm2d:
            new = LastBatchNorm(child) if last else StackedBatchNorm(child)
        elif any(True for _ in child.parameters(recurse=False)) or any(True for _ in child.buffers(recurse=False)):
            raise ValueError(f"layer {name} ({type(child).__name__}) has no stacked twin here")
        else:
            continue
        parent, _, attribute = name.rpartition(".")
        setattr(twin.get_submodule(parent), attribute, new)
    return twin


class FormModel:
    """The batched model `StaticStep` trains (pflbench.simulator.static_step.ClientModel), its convolutions in one form:
    the same twin on every device (the engine picks the grouped twin on CUDA, the loop on a CPU)."""

    def __init__(self, module: nn.Module, form: str, layout: str) -> None:
        self.twin = form_twin(module, form, layout)
        self.param_names = [n for n, _ in module.named_parameters()]
        self.buffer_names = [n for n, _ in module.named_buffers()]
        self.static_steps: dict = {}
        self._twins: dict[bool, Any] = {True: self.twin, False: self.twin}
        self.channels_last = layout == "last"

    def forward(self, state: dict[str, Tensor], x: Tensor, train: bool) -> Tensor:
        clients, batch = x.shape[:2]
        self.twin.train(train)
        out = functional_call(self.twin, state, (x.flatten(0, 1),))
        return out.view(clients, batch, *out.shape[1:])


# ---- the data of one (model, width): a starting state, input batches, the float64 reference ----------------

@dataclass
class Problem:
    model: str
    shape: tuple[int, int, int]
    width: int
    batch: int
    module: nn.Module
    state: dict[str, Tensor]     # [K, ...] float32 (counters int64), on the CPU
    xs: list[Tensor]             # POOL x [K, B, C, H, W] float32, on the CPU
    ys: list[Tensor]             # POOL x [K, B] int64
    reference: dict[str, Tensor] | None = None  # the state after one float64 step on xs[0], ys[0]
    reference_losses: Tensor | None = None        # [K] float64
    reference_grads: dict[str, Tensor] | None = None  # that step's gradients, [K, ...] float64


def problem(model: str, width: int, batch: int, seed: int = 0) -> Problem:
    """Clients that start near one initial model (parameters 0.01 apart), on Gaussian images."""
    shape = MODELS[model][0]
    torch.manual_seed(seed)
    module = build_model(model, shape, CLASSES)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        stacked = t.detach().unsqueeze(0).repeat(width, *([1] * t.dim()))
        if isinstance(t, nn.Parameter):
            stacked = stacked + 0.01 * torch.randn(stacked.shape, generator=gen)
        state[name] = stacked
    xs = [torch.randn(width, batch, *shape, generator=gen) for _ in range(POOL)]
    ys = [torch.randint(0, CLASSES, (width, batch), generator=gen) for _ in range(POOL)]
    return Problem(model, shape, width, batch, module, state, xs, ys)


def reference_step(p: Problem) -> None:
    """One step of every client in float64 on the CPU, each client's plain module on its own batch (no
    batching code): cross-entropy, its gradient, p - lr * g; BatchNorm's statistics updated as in training."""
    module = copy.deepcopy(p.module).double().train()
    names = [n for n, _ in module.named_parameters()]
    new: dict[str, list[Tensor]] = {n: [] for n in p.state}
    gradients: dict[str, list[Tensor]] = {n: [] for n in names}
    losses = []
    for k in range(p.width):
        client = {n: t[k].double() if t.is_floating_point() else t[k].clone() for n, t in p.state.items()}
        params = {n: client[n].clone().requires_grad_(True) for n in names}
        buffers = {n: t.clone() for n, t in client.items() if n not in params}
        logits = functional_call(module, {**params, **buffers}, (p.xs[0][k].double(),))
        loss = F.cross_entropy(logits, p.ys[0][k])
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for (n, t), g in zip(params.items(), grads):
                new[n].append(t - LR * g)
                gradients[n].append(g)
        for n, t in buffers.items():
            new[n].append(t)
        losses.append(loss.detach())
    p.reference = {n: torch.stack(ts) for n, ts in new.items()}
    p.reference_losses = torch.stack(losses)
    p.reference_grads = {n: torch.stack(gs) for n, gs in gradients.items()}


def gradient_error(p: Problem, model: FormModel, device: str, layout: str) -> float:
    """||g - g_ref|| / ||g_ref|| over every parameter of every client: the batched gradient of the first
    step's summed per-client losses through `model`'s form (the kernels a captured step replays)."""
    assert p.reference_grads is not None
    state = {n: t.to(device, copy=True) for n, t in p.state.items()}  # BatchNorm updates its statistics
    leaves = [state[n].requires_grad_(True) for n in model.param_names]
    logits = model.forward(state, placed(p.xs[0], device, layout), train=True)
    y = p.ys[0].to(device)
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(dim=1)
    grads = torch.autograd.grad(losses.sum(), leaves)
    off = sum(float((g.detach().cpu().double() - p.reference_grads[n]).pow(2).sum())
              for n, g in zip(model.param_names, grads))
    norm = sum(float(g.pow(2).sum()) for g in p.reference_grads.values())
    return math.sqrt(off / norm) if norm else float("nan")


def distances(p: Problem, state: dict[str, Tensor], losses: Tensor) -> dict:
    """How far one step's outcome (`state`, the rows' `losses`) is from the float64 reference."""
    assert p.reference is not None and p.reference_losses is not None
    params = [n for n, _ in p.module.named_parameters()]
    worst_params = worst_buffers = 0.0
    moved = moved_ref = 0.0
    counters_equal = True
    for name, ref in p.reference.items():
        got = state[name].detach().cpu()
        if not ref.is_floating_point():
            counters_equal = counters_equal and torch.equal(got, ref)
            continue
        diff = float((got.double() - ref).abs().nan_to_num(float("inf")).max())
        if name in params:
            worst_params = max(worst_params, diff)
            start = p.state[name].double()
            moved += float(((got.double() - start) - (ref - start)).pow(2).sum())
            moved_ref += float((ref - start).pow(2).sum())
        else:
            worst_buffers = max(worst_buffers, diff)
    return {"max_abs_diff_params": worst_params, "max_abs_diff_buffers": worst_buffers,
            "max_abs_diff_losses": float((losses.detach().cpu().double() - p.reference_losses).abs().max()),
            "update_rel_error": math.sqrt(moved / moved_ref) if moved_ref else float("nan"),
            "counters_equal": counters_equal}


# ---- one combination: build the step, check it against the reference, time it -------------------------------

def set_tf32(setting: str) -> dict:
    """Apply a TF32 setting (TF32's names); what torch reports afterwards."""
    matmul, conv = TF32[setting]
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = conv
    return {"matmul_tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32}


def placed(x: Tensor, device: str, layout: str) -> Tensor:
    """[K, B, C, H, W] on `device`, its [K*B, C, H, W] view in the layout's memory order."""
    x = x.to(device)
    if layout == "last":
        return x.flatten(0, 1).to(memory_format=torch.channels_last).view(x.shape)
    return x.contiguous()


def first_step(p: Problem, form: str, layout: str, captured: bool, device: str) -> tuple[StaticStep, float]:
    """The form's StaticStep (captured on CUDA if `captured`) and the seconds building it took, after one step
    from the problem's state on its first batch: `step.state` and `step.loss_sum` hold that step's outcome."""
    cuda = device.startswith("cuda")
    model = FormModel(p.module, form, layout)
    state = {n: t.to(device, copy=True) for n, t in p.state.items()}
    x, y = placed(p.xs[0], device, layout), p.ys[0].to(device)
    sgd = SGD(LR)
    began = time.perf_counter()
    step = StaticStep(model, state, set(model.param_names), x, y, sgd, captured)
    if cuda:
        torch.cuda.synchronize()
    built = time.perf_counter() - began
    step.load(state, RowRates.of([sgd] * p.width, device))
    step.x.copy_(x)
    step.y.copy_(y)
    step.run()
    return step, built


def timed(step: StaticStep, xs: list[Tensor], ys: list[Tensor], steps: int, repeats: int, cuda: bool) -> list[float]:
    """Seconds per step of `repeats` runs of `steps` steps after WARMUP, each step first copying the next of
    the input batches into the step's buffers (CUDA events around a run on CUDA, the host clock elsewhere)."""
    def run(count: int) -> None:
        for s in range(count):
            step.x.copy_(xs[s % len(xs)])
            step.y.copy_(ys[s % len(ys)])
            step.run()

    run(WARMUP)
    return [seconds_per_step(lambda: run(steps), steps, cuda) for _ in range(repeats)]


def run_case(p: Problem, form: str, layout: str, captured: bool, device: str, steps: int, repeats: int) -> dict:
    cuda = device.startswith("cuda")
    grad_error = gradient_error(p, FormModel(p.module, form, layout), device, layout)
    step, built = first_step(p, form, layout, captured, device)
    figures: dict = {"captured": step.graph is not None, "build_seconds": built, "grad_rel_error": grad_error,
                     **distances(p, step.state, step.loss_sum)}
    xs = [placed(x, device, layout) for x in p.xs]
    ys = [y.to(device) for y in p.ys]
    times = timed(step, xs, ys, steps, repeats, cuda)
    finite = all(bool(torch.isfinite(t).all()) for t in step.state.values() if t.is_floating_point())
    seconds = statistics.median(times)
    figures.update(seconds_per_step=seconds, spread=(max(times) - min(times)) / seconds if seconds else None,
                   sample_steps_per_second=p.width * p.batch / seconds, finite_after_timing=finite)
    del step
    if cuda:
        torch.cuda.empty_cache()
    return figures


def table_batch_size() -> int:
    import yaml

    return int(yaml.safe_load(TABLE1.read_text())["defaults"]["batch_size"])


def plan(models: list[str], widths: list[int], batch: int, forms: list[str], layouts: list[str], tf32: list[str],
         cuda: bool) -> list[dict]:
    """The combinations to measure, in order of importance: the TF32 settings as given (default first), then
    model, width, layout, form, eager before captured. On CUDA the loop form only captured; on a CPU nothing
    captured."""
    cases = []
    for setting in tf32:
        for model in models:
            for width in widths:
                for layout in layouts:
                    for form in forms:
                        captures = ([True] if form == "loop" else [False, True]) if cuda else [False]
                        cases += [{"model": model, "input": list(MODELS[model][0]), "width": width, "batch": batch,
                                   "form": form, "layout": layout, "tf32": setting,
                                   "capture": "graph" if captured else "eager"} for captured in captures]
    return cases


def measure(device: str, models: list[str], widths: list[int], batch: int, forms: list[str], layouts: list[str],
            tf32: list[str], steps: int, repeats: int, seconds: float) -> dict:
    """Every combination of `plan`, none started after `seconds`."""
    cuda = device.startswith("cuda")
    deadline = time.monotonic() + seconds
    problems = {}
    for model in models:
        for width in widths:
            p = problem(model, width, batch)
            began = time.perf_counter()
            reference_step(p)
            problems[(model, width)] = p
            print(f"kernels: float64 reference of {model} at {width} rows in {time.perf_counter() - began:.1f} s",
                  flush=True)
    cases = plan(models, widths, batch, forms, layouts, tf32, cuda)
    for case in cases:
        if time.monotonic() > deadline:
            case["status"] = "not run (time)"
            continue
        case.update(set_tf32(case["tf32"]) if cuda else {"matmul_tf32": None, "cudnn_tf32": None})
        try:
            case.update(run_case(problems[(case["model"], case["width"])], case["form"], case["layout"],
                                 case["capture"] == "graph", device, steps, repeats),
                        status="ok")
        except Exception as error:  # recorded; the next combination runs
            case.update(status="failed", error=f"{type(error).__name__}: {error}")
    if cuda:
        set_tf32("default")
    ratios(cases)
    return {"cases": cases, "fastest": fastest(cases)}


def _key(case: dict, **changed: str) -> tuple:
    c = {**case, **changed}
    return (c["model"], c["width"], c["form"], c["layout"], c["tf32"], c["capture"])


def ratios(cases: list[dict]) -> None:
    """Each case's seconds over the grouped form's (all else equal) and over today's path."""
    seconds = {_key(c): c["seconds_per_step"] for c in cases if c.get("status") == "ok"}
    for case in cases:
        if case.get("status") != "ok":
            continue
        grouped = seconds.get(_key(case, form="grouped"))
        today = seconds.get(_key(case, form="grouped", layout="first", tf32="default", capture="eager"))
        case["ratio_to_grouped"] = case["seconds_per_step"] / grouped if grouped else None
        case["ratio_to_today"] = case["seconds_per_step"] / today if today else None


def fastest(cases: list[dict]) -> dict:
    """Per model and width: the fastest case's settings and figures."""
    best: dict = {}
    for case in cases:
        if case.get("status") != "ok":
            continue
        name = f"{case['model']}@{case['width']}"
        if name not in best or case["seconds_per_step"] < best[name]["seconds_per_step"]:
            best[name] = {k: case[k] for k in ("form", "layout", "tf32", "capture", "seconds_per_step",
                                                "sample_steps_per_second", "ratio_to_today", "grad_rel_error",
                                                "max_abs_diff_params")}
    return best


def print_table(figures: dict) -> None:
    """One line per (model, width, TF32, layout, form): eager and captured ms a step; the ratios and the
    distances from the reference of the captured step where it ran, else of the eager one."""
    print(figures["capture_note"])
    print(f"{'model':7s} {'K':>4s} {'tf32':7s} {'layout':6s} {'form':8s} {'eager ms':>9s} {'graph ms':>9s} "
          f"{'/grouped':>8s} {'/today':>7s} {'grad.err':>9s} {'max|dp|':>9s}")
    rows: dict = {}
    for c in figures["cases"]:
        rows.setdefault((c["model"], c["width"], c["tf32"], c["layout"], c["form"]), {})[c["capture"]] = c
    for (model, width, tf32, layout, form), by in rows.items():
        shown = by.get("graph") if by.get("graph", {}).get("status") == "ok" else by.get("eager")
        if shown is None or shown.get("status") != "ok":
            status = (shown or {}).get("error") or (shown or {}).get("status")
            print(f"{model:7s} {width:4d} {tf32:7s} {layout:6s} {form:8s} {status}")
            continue

        def ms(capture: str) -> str:
            c = by.get(capture, {})
            return f"{c['seconds_per_step'] * 1e3:9.3f}" if c.get("status") == "ok" else f"{'-':>9s}"

        def ratio(value: float | None) -> str:
            return f"{value:.2f}" if value is not None else "-"

        print(f"{model:7s} {width:4d} {tf32:7s} {layout:6s} {form:8s} {ms('eager')} {ms('graph')} "
              f"{ratio(shown['ratio_to_grouped']):>8s} {ratio(shown['ratio_to_today']):>7s} "
              f"{shown['grad_rel_error']:9.2e} {shown['max_abs_diff_params']:9.2e}")
    for name, best in figures["fastest"].items():
        print(f"fastest at {name}: {best['form']}, channels-{best['layout']}, tf32 {best['tf32']}, {best['capture']}: "
              f"{best['seconds_per_step'] * 1e3:.3f} ms a step ({best['sample_steps_per_second']:.0f} sample-steps/s,"
              f" {best['ratio_to_today'] or float('nan'):.2f} of today's), gradient error {best['grad_rel_error']:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--widths", default="10,100", help="rows (clients) of the step, comma-separated")
    parser.add_argument("--batch", type=int, default=None, help="default: benchmarks/table1.yaml's batch_size")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--tf32", default=None, help=f"of {', '.join(TF32)} (default: all on CUDA, `default` on a CPU)")
    parser.add_argument("--steps", type=int, default=20, help="steps a timed repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=150.0, help="no combination starts after this")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms (engine: off)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("kernels: torch sees no CUDA device", file=sys.stderr)
        return 3
    chosen = {"models": args.models.split(","), "forms": args.forms.split(","), "layouts": args.layouts.split(","),
              "tf32": (args.tf32 or (",".join(TF32) if cuda else "default")).split(",")}
    allowed = {"models": tuple(MODELS), "forms": FORMS, "layouts": LAYOUTS, "tf32": tuple(TF32)}
    for what, names in chosen.items():
        unknown = sorted(set(names) - set(allowed[what]))
        if unknown:
            parser.error(f"--{what}: unknown {', '.join(unknown)}; the choices: {', '.join(allowed[what])}")
    batch = args.batch or table_batch_size()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    figures: dict = {
        "device": args.device, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "capture_note": ("CUDA graphs: each form eager and captured" if cuda else
                         "no CUDA: capture not exercised and TF32 does not apply (every form eagerly, in float32)"),
        "reference": "float64 on the CPU, each client's plain module one at a time, one step from the same state",
        "steps": args.steps, "repeats": args.repeats, "batch": batch, "lr": LR,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    began = time.monotonic()
    failed = False
    try:
        figures.update(measure(args.device, chosen["models"], [int(w) for w in args.widths.split(",")], batch,
                               chosen["forms"], chosen["layouts"], chosen["tf32"], args.steps, args.repeats,
                               args.seconds))
    except Exception as error:
        figures["error"] = f"{type(error).__name__}: {error}"
        failed = True
    figures["seconds"] = time.monotonic() - began
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    if failed:
        print(f"kernels: {figures['error']}", file=sys.stderr)
        return 1
    print_table(figures)
    cases = figures["cases"]
    bad = [c for c in cases if c["status"] == "failed" or (c["status"] == "ok" and not c["finite_after_timing"])]
    for c in bad:
        print(f"kernels: {c['model']} {c['width']} {c['form']} {c['layout']} {c['tf32']} {c['capture']}: "
              f"{c.get('error', 'not finite after the timed steps')}", file=sys.stderr)
    skipped = sum(c["status"] == "not run (time)" for c in cases)
    done = len(cases) - skipped - len(bad)
    print(f"kernels: {done} of {len(cases)} combinations ok, {skipped} not run (time), {len(bad)} failed, "
          f"in {figures['seconds']:.0f} s")
    return 1 if bad or not done else 0


if __name__ == "__main__":
    sys.exit(main())
