"""The GPU check's `graphs` step (benchmarks/gpu/graphs.py) at the rehearsal's size on the CPU: the static step
runs eagerly ("no CUDA: capture not exercised") and its figures say the eager and the static step agree to the
bit — the timed step's parameters and losses at every width, the column's rows' evaluated losses and
accuracies with `cuda_graphs` off and on, and the methods' own steps (pFedMe, Per-FedAvg, pFedHN's official
inner optimizer) at the column's width."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import graphs  # noqa: E402
from test_gpu_column_groups import fmnist  # noqa: E402, F401  (the fixture: Fashion-MNIST from the mirror)


def test_largest_difference_names_any_disagreement():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([3])}
    assert graphs.largest_difference(a, {"w": torch.tensor([1.0, 2.5]), "n": torch.tensor([3])}) == 0.5
    assert graphs.largest_difference(a, {"w": torch.tensor([1.0, float("nan")]), "n": torch.tensor([3])}) == float(
        "inf"
    )
    assert graphs.largest_difference(a, {"w": a["w"], "n": torch.tensor([4])}) == float("inf")


@pytest.mark.usefixtures("fmnist")
def test_the_rehearsal_reports_bit_identity_and_no_capture(tmp_path):
    out = tmp_path / "graphs.json"
    assert (
        graphs.main(
            [
                "--device",
                "cpu",
                "--widths",
                "2,3",
                "--steps",
                "2",
                "--repeats",
                "1",
                "--rows",
                "fedavg,fedbn",
                "--rounds",
                "2",
                "--samples",
                "30",
                "--epochs",
                "1",
                "--own-inner-steps",
                "3",
                "--own-repeats",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    assert figures["capture"].startswith("no CUDA: capture not exercised")
    assert set(figures["step"]) == {"2", "3"}
    for width, step in figures["step"].items():
        assert step["bit_identical"] and step["max_abs_diff_params"] == step["max_abs_diff_losses"] == 0.0
        assert not step["captured"] and step["eager_seconds_per_step"] > 0 and step["static_seconds_per_step"] > 0
        assert step["static_sample_steps_per_second"] == int(width) * 32 / step["static_seconds_per_step"]
    column = figures["column"]
    assert set(column["rows"]) == {"fedavg", "fedbn"} and column["seconds_off"] > 0 and column["seconds_on"] > 0
    for row in column["rows"].values():
        assert row["status"] == ["finished", "finished"]
        assert row["loss_bit_identical"] and row["accuracy_bit_identical"] and row["max_abs_diff_loss"] == 0.0
    own = figures["own"]
    assert set(own) == {"pfedme", "perfedavg", "pfedhn"}
    for name, row in own.items():
        assert row["bit_identical"] and row["max_abs_diff"] == 0.0 and not row["captured"], name
        assert row["rows"] == (1 if name == "pfedhn" else 10) and row["steps"] >= 1
        assert row["eager_ms_per_step"] > 0 and row["static_ms_per_step"] > 0
    assert own["pfedhn"]["steps"] == 3
    assert figures["verdict"] == {
        "verified": False,
        "reasons": ["no CUDA device: capture not exercised"],
        "rule": graphs.RULE,
    }


def test_the_verdict_asks_every_comparison_to_be_bit_identical_and_captured():
    """The rule written before any device judged it (graphs.RULE): on CUDA, everything equal to the bit and
    captured; any difference, however small, a fallback to eager, a failed part or row leaves it unverified."""
    good = {
        "step": {"10": {"bit_identical": True, "captured": True}},
        "column": {
            "rows": {
                "fedavg": {
                    "status": ["finished", "finished"],
                    "loss_bit_identical": True,
                    "accuracy_bit_identical": True,
                }
            }
        },
        "own": {"pfedme": {"bit_identical": True, "captured": True}},
    }
    assert graphs.verdict(good, cuda=True)["verified"]
    tiny = json.loads(json.dumps(good))
    tiny["column"]["rows"]["fedavg"]["accuracy_bit_identical"] = False
    assert graphs.verdict(tiny, cuda=True)["reasons"] == ["column fedavg: not bit-identical in accuracy"]
    eager = json.loads(json.dumps(good))
    eager["own"]["pfedme"]["captured"] = False
    assert graphs.verdict(eager, cuda=True)["reasons"] == ["own steps of pfedme: not captured"]
    broken = {k: v for k, v in good.items() if k != "own"} | {"own_error": "RuntimeError: boom"}
    assert graphs.verdict(broken, cuda=True)["reasons"] == ["own_error: RuntimeError: boom"]
    assert not graphs.verdict({k: v for k, v in good.items() if k != "step"}, cuda=True)["verified"]


def test_bit_identical_sees_signed_zeros_and_nans():
    a = {"w": torch.tensor([0.0, float("nan")]), "n": torch.tensor([3])}
    assert graphs.bit_identical(a, {"w": torch.tensor([0.0, float("nan")]), "n": torch.tensor([3])})
    assert not graphs.bit_identical(a, {"w": torch.tensor([-0.0, float("nan")]), "n": torch.tensor([3])})
    assert not graphs.bit_identical(a, {"w": a["w"]})
