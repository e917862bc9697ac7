"""The GPU check's `kernels` step (benchmarks/gpu/kernels.py) on the CPU: every convolution form computes the
batched CNN step the engine computes. On a CPU nothing is captured and TF32 does not apply, so every form is
float32 arithmetic in another order, and the stated tolerances are float32's (measured here: gradients within
~6e-7 relative of the float64 reference, parameters after a step within ~6e-8, losses within ~3e-7)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import kernels  # noqa: E402

GRADIENT = 1e-5  # ||g - g_ref|| / ||g_ref||, float32 against float64
PARAMS = 1e-6  # max |diff| of parameters and BatchNorm statistics after one step (lr 0.005)
LOSSES = 1e-5  # max |diff| of the rows' mean losses (about 2.3 each)


def test_fold_last_and_unfold_last_are_inverse_and_keep_channels_last_order():
    x = torch.randn(3 * 4, 5, 6, 7).to(memory_format=torch.channels_last)
    folded = kernels.fold_last(x, 3)
    assert folded.shape == (4, 15, 6, 7) and folded.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(folded[:, 5:10], x[4:8])  # client 1's channels are block 1
    back = kernels.unfold_last(folded, 3)
    assert back.is_contiguous(memory_format=torch.channels_last) and torch.equal(back, x)


@pytest.mark.parametrize("form", kernels.FORMS)
@pytest.mark.parametrize("layout", kernels.LAYOUTS)
def test_each_convolution_form_is_each_clients_convolution(form, layout):
    """Stride 2 and padding 2 (the models use neither): the form's layer against F.conv2d client by client."""
    gen = torch.Generator().manual_seed(1)
    clients, batch = 3, 2
    layer = nn.Conv2d(4, 6, 5, stride=2, padding=2)
    twin = kernels.form_twin(nn.Sequential(layer), form, layout)[0]
    weight = torch.randn(clients, 6, 4, 5, 5, generator=gen)
    bias = torch.randn(clients, 6, generator=gen)
    x = torch.randn(clients * batch, 4, 11, 9, generator=gen)
    if layout == "last":
        x = x.to(memory_format=torch.channels_last)
    out = torch.func.functional_call(twin, {"weight": weight, "bias": bias}, (x,))
    expected = torch.cat(
        [F.conv2d(x[k * batch : (k + 1) * batch], weight[k], bias[k], stride=2, padding=2) for k in range(clients)]
    )
    assert out.shape == expected.shape == (clients * batch, 6, 6, 5)
    assert (out - expected).abs().max() < 1e-4
    if layout == "last":
        assert out.is_contiguous(memory_format=torch.channels_last)


def test_a_layer_without_a_twin_is_refused_by_name():
    with pytest.raises(ValueError, match="layer 1 .LayerNorm. has no stacked twin"):
        kernels.form_twin(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), "grouped", "first")


@pytest.mark.parametrize("model", ["cnn", "cnn-bn"])
def test_every_form_and_layout_is_the_reference_step_and_the_others(model):
    """One batched step per form and layout from the same state and batch (StaticStep, eagerly): each within
    float32's tolerance of the float64 reference, the BatchNorm counters equal, and the forms within twice that
    of each other."""
    p = kernels.problem(model, width=3, batch=4)
    kernels.reference_step(p)
    params = [name for name, _ in p.module.named_parameters()]
    outcomes = {}
    for form in kernels.FORMS:
        for layout in kernels.LAYOUTS:
            step, _ = kernels.first_step(p, form, layout, captured=False, device="cpu")
            assert step.graph is None
            far = kernels.distances(p, step.state, step.loss_sum)
            assert far["counters_equal"], (form, layout)
            assert far["max_abs_diff_params"] < PARAMS and far["max_abs_diff_buffers"] < PARAMS, (form, layout, far)
            assert far["max_abs_diff_losses"] < LOSSES, (form, layout, far)
            moved = max(float((step.state[n].detach() - p.state[n]).abs().max()) for n in params)
            assert moved > 100 * PARAMS  # the step moved the parameters: the comparison is not of start states
            grads = kernels.gradient_error(p, kernels.FormModel(p.module, form, layout), "cpu", layout)
            assert grads < GRADIENT, (form, layout, grads)
            outcomes[(form, layout)] = ({n: t.detach().clone() for n, t in step.state.items()}, step.loss_sum.clone())
    base_state, base_losses = outcomes[("grouped", "first")]
    for key, (state, losses) in outcomes.items():
        for name, t in state.items():
            if t.is_floating_point():
                assert (t - base_state[name]).abs().max() < 2 * PARAMS, (key, name)
            else:
                assert torch.equal(t, base_state[name]), (key, name)
        assert (losses - base_losses).abs().max() < 2 * LOSSES, key
    if model == "cnn-bn":  # the statistics moved too: what was compared is the step's, not the start's
        assert (outcomes[("loop", "last")][0]["bn1.running_mean"] - p.state["bn1.running_mean"]).abs().max() > 1e-3


def test_the_rehearsal_measures_every_form_and_says_capture_is_not_exercised(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    assert (
        kernels.main(
            ["--device", "cpu", "--widths", "2", "--batch", "4", "--steps", "2", "--repeats", "2", "--json", str(out)]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    assert figures["capture_note"].startswith("no CUDA: capture not exercised")
    assert figures["capture_note"] in capsys.readouterr().out
    cases = figures["cases"]
    assert {(c["model"], c["form"], c["layout"]) for c in cases} == {
        (m, f, la) for m in kernels.MODELS for f in kernels.FORMS for la in kernels.LAYOUTS
    }
    for case in cases:
        assert case["status"] == "ok" and case["capture"] == "eager" and not case["captured"]
        assert case["tf32"] == "default" and case["width"] == 2 and case["batch"] == 4
        assert case["grad_rel_error"] < GRADIENT and case["max_abs_diff_params"] < PARAMS
        assert case["seconds_per_step"] > 0 and case["finite_after_timing"]
        assert case["sample_steps_per_second"] == pytest.approx(8 / case["seconds_per_step"])
        grouped = next(
            c for c in cases if (c["model"], c["layout"], c["form"]) == (case["model"], case["layout"], "grouped")
        )
        today = next(c for c in cases if (c["model"], c["layout"], c["form"]) == (case["model"], "first", "grouped"))
        assert case["ratio_to_grouped"] == pytest.approx(case["seconds_per_step"] / grouped["seconds_per_step"])
        assert case["ratio_to_today"] == pytest.approx(case["seconds_per_step"] / today["seconds_per_step"])
    for model in kernels.MODELS:
        best = figures["fastest"][f"{model}@2"]
        assert best["seconds_per_step"] == min(c["seconds_per_step"] for c in cases if c["model"] == model)


def test_a_run_past_its_time_keeps_what_it_measured_and_fails_if_nothing_ran(tmp_path):
    out = tmp_path / "kernels.json"
    assert (
        kernels.main(
            [
                "--device",
                "cpu",
                "--models",
                "cnn",
                "--widths",
                "2",
                "--batch",
                "4",
                "--steps",
                "1",
                "--repeats",
                "1",
                "--seconds",
                "0",
                "--json",
                str(out),
            ]
        )
        == 1
    )
    assert {c["status"] for c in json.loads(out.read_text())["cases"]} == {"not run (time)"}


def test_unknown_choices_are_named(capsys):
    with pytest.raises(SystemExit):
        kernels.main(["--device", "cpu", "--forms", "grouped,winograd"])
    assert "--forms: unknown winograd; the choices: grouped, unfold, loop" in capsys.readouterr().err


def test_the_batch_is_table_1s():
    import yaml

    assert kernels.table_batch_size() == yaml.safe_load(kernels.TABLE1.read_text())["defaults"]["batch_size"] == 32


def test_the_device_plan_measures_every_form_layout_and_tf32_setting_most_important_first():
    """What the device runs (nothing here has CUDA, so the plan is checked instead): 120 combinations at the
    paper's widths, each form in both layouts eager and captured, the per-client loop captured only; today's
    TF32 setting first and IEEE last, so that a run cut by its time loses the least important."""
    cases = kernels.plan(
        list(kernels.MODELS), [10, 100], 32, list(kernels.FORMS), list(kernels.LAYOUTS), list(kernels.TF32), cuda=True
    )
    assert len(cases) == 120 and len({kernels._key(c) for c in cases}) == 120
    assert {c["capture"] for c in cases if c["form"] == "loop"} == {"graph"}
    assert {c["capture"] for c in cases if c["form"] != "loop"} == {"eager", "graph"}
    assert [c["tf32"] for c in cases[::40]] == ["default", "tf32", "ieee"]
    assert {
        c["capture"] for c in kernels.plan(["cnn"], [2], 4, list(kernels.FORMS), ["first"], ["default"], cuda=False)
    } == {"eager"}


def test_tf32_settings_set_both_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        assert kernels.set_tf32("tf32") == {"matmul_tf32": True, "cudnn_tf32": True}
        assert kernels.set_tf32("ieee") == {"matmul_tf32": False, "cudnn_tf32": False}
        assert kernels.set_tf32("default") == {"matmul_tf32": False, "cudnn_tf32": True}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; b = torch.backends; print(b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert fresh == [str(v) for v in kernels.TF32["default"]]  # `default` is what a fresh torch has (the engine's)
