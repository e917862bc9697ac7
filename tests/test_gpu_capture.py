"""A CUDA-graph capture that fails falls back to the eager step with one line on stderr (pflbench.simulator.captured):
forced on this CPU, where asking for a capture fails (no CUDA), and by a capture that raises as a device's
would (an op that cannot be captured). The fallback computes what the eager step computes."""

import pytest
import torch

from pflbench.simulator import captured
from pflbench.simulator.captured import Captured, StaticLoop, capture_or_none


def test_a_capture_that_fails_runs_the_function_eagerly_and_says_so(capsys):
    calls = []
    if torch.cuda.is_available():
        pytest.skip("this machine can capture: the fallback is forced below instead")
    step = Captured(lambda: calls.append(1), capture_it=True, what="the test's step")
    assert step.graph is None
    note = capsys.readouterr().err
    assert "capturing the test's step as a CUDA graph failed" in note and "it runs eagerly" in note
    step.run()
    assert calls == [1]


def test_a_static_loop_whose_capture_fails_gives_the_eager_loops_numbers(monkeypatch, capsys):
    def refuse(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(captured, "capture", refuse)
    assert capture_or_none(lambda: None, "x") is None
    assert "RuntimeError: operation not permitted when stream is capturing" in capsys.readouterr().err

    def body(carry, inputs):
        w = carry["state"]["w"]
        return {"state": {"w": w - 0.1 * (w * inputs[0]).sin()}}

    start = {"state": {"w": torch.linspace(-1, 1, 7)}}
    results = {}
    for capture_it in (False, True):
        loop = StaticLoop(start, [torch.zeros(7)], body, capture_it, what="the test's loop")
        loop.load(start)
        for x in range(3):
            loop.feed(0, torch.full((7,), float(x)))
            loop.run()
        results[capture_it] = loop.result()["state"]["w"]
    assert torch.equal(results[False], results[True])
    assert "capturing the test's loop as a CUDA graph failed" in capsys.readouterr().err
