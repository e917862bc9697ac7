"""The GPU check's step runner (benchmarks/gpu/check.py): a failing or overrunning step is recorded and
the next one still runs; a spent budget skips the rest; figures a step writes land in check.json. The
whole check is rehearsed on the CPU by CI (`make gpu-rehearse`, .ci/run).

No outcome here depends on how fast the machine is: a step that must finish has a box scaled by the load
(tests/budgets.py), the step that must overrun its box never ends by itself, and the spent budget is
spent on the check's own clock by the step before (not by a sleep that a busy machine could stretch)."""

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from budgets import scaled

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import check  # noqa: E402


def test_a_failing_step_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    figures = tmp_path / "figures.json"
    box = scaled(30)  # a Python start, even on a busy machine
    steps = [
        check.Step("fails", [sys.executable, "-c", "import sys; print('boom'); sys.exit(4)"], box),
        check.Step("hangs", [sys.executable, "-c", "import threading; threading.Event().wait()"], 6),
        check.Step(
            "works",
            [
                sys.executable,
                "-c",
                f"import json; open({str(figures)!r}, 'w').write(json.dumps({{'x': 1}})); "
                "print('FIGURES ' + json.dumps({'y': 2}))",
            ],
            box,
            figures,
        ),
    ]
    monkeypatch.setattr(check, "steps", lambda device, rehearse, work: steps)
    assert check.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--budget", f"{3 * box + 6:.0f}"]) == 1
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    status = {name: step["status"] for name, step in result["steps"].items()}
    assert status == {"fails": "failed", "hangs": "timeout", "works": "ok"}, status
    assert result["steps"]["fails"]["returncode"] == 4 and "boom" in result["steps"]["fails"]["last_lines"]
    assert result["steps"]["works"]["figures"] == {"x": 1}  # the step's file wins over its FIGURES line
    assert result["all_ok"] is False
    log = (tmp_path / "out" / "check.log").read_text()
    assert "===== fails: failed" in log and "===== hangs: timeout" in log


def test_a_spent_budget_skips_the_remaining_steps(tmp_path, monkeypatch):
    """The check's clock: the real one plus the seconds the step "slow" says it took (in a file), so that it
    spends 1000 s of a budget of scaled(30) whatever the machine's load, and finishes ok."""
    took = tmp_path / "took"

    def monotonic() -> float:
        return time.monotonic() + (float(took.read_text()) if took.exists() else 0.0)

    monkeypatch.setattr(check, "time", SimpleNamespace(monotonic=monotonic, strftime=time.strftime))
    box = scaled(30)
    steps = [
        check.Step("slow", [sys.executable, "-c", f"open({str(took)!r}, 'w').write('1000')"], box),
        check.Step("next", [sys.executable, "-c", "pass"], box),
    ]
    monkeypatch.setattr(check, "steps", lambda device, rehearse, work: steps)
    assert check.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--budget", f"{box:.0f}"]) == 1
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert result["steps"]["slow"]["status"] == "ok"
    assert result["steps"]["next"]["status"] == "skipped"


def test_only_names_known_steps(tmp_path, capsys):
    with pytest.raises(SystemExit):
        check.main(["--out", str(tmp_path), "--device", "cpu", "--only", "bench_10,nope"])
    assert "unknown step(s) nope" in capsys.readouterr().err


def test_the_device_steps_fit_the_budget(tmp_path, monkeypatch):
    """The device's command limit is 10 minutes: the boxes of a plain run's steps together stay inside the
    default budget of 9 minutes, so no step is skipped for lack of it; a step of its own call fits alone."""
    device = check.steps("cuda", False, Path("/tmp"))
    total = sum(step.timeout for step in device if not step.separate)
    assert total <= 540, total
    assert all(step.timeout <= 540 for step in device if step.separate)
    quick = [check.Step("quick", [sys.executable, "-c", ""], scaled(30))]
    monkeypatch.setattr(check, "steps", lambda device, rehearse, work: quick)
    assert check.main(["--out", str(tmp_path), "--device", "cpu"]) == 0
    assert json.loads((tmp_path / "check.json").read_text())["budget_seconds"] == 540


def test_the_device_and_the_rehearsal_run_the_same_steps_with_the_group_steps_last():
    """Every step the device runs is rehearsed (CI: each must say "ok"); the cell-group steps come after
    `concurrent`, whose plateau they are compared with, and write their figures into check.json."""
    device = check.steps("cuda", False, Path("/w"))
    rehearsal = check.steps("cpu", True, Path("/w"))
    assert [s.name for s in device] == [s.name for s in rehearsal]
    device = [s for s in device if not s.separate]
    rehearsal = [s for s in rehearsal if not s.separate]
    names = [s.name for s in device]
    assert names[-2:] == ["column_groups", "group_100"] and names.index("concurrent") < names.index("column_groups")
    for step in device[-2:] + rehearsal[-2:]:
        assert step.figures == Path("/w") / f"{step.name}.json" and str(step.figures) in step.command
        assert "--sharing" in step.command and str(Path("/w") / "concurrent.json") in step.command
    ten, hundred = (step.command for step in device[-2:])
    assert ten[ten.index("--clients") + 1] == "10" and "--samples" not in ten  # the paper's settings on the GPU
    assert hundred[hundred.index("--clients") + 1] == "100" and "projected" in hundred


def test_the_graphs_step_compares_graphs_on_and_off_at_the_paper_sizes_on_the_device():
    """The captured step's check (graphs.py) runs on the device and in the rehearsal, before the group steps,
    and writes its figures into check.json; on the device at the paper's settings (no --samples)."""
    device = {s.name: s for s in check.steps("cuda", False, Path("/w"))}
    rehearsal = {s.name: s for s in check.steps("cpu", True, Path("/w"))}
    names = list(device)
    assert names.index("graphs") == names.index("column_groups") - 1
    for step in (device["graphs"], rehearsal["graphs"]):
        assert step.figures == Path("/w") / "graphs.json" and str(step.figures) in step.command
        assert str(check.HERE / "graphs.py") in step.command
    assert "--samples" not in device["graphs"].command and "--samples" in rehearsal["graphs"].command
    assert device["graphs"].timeout <= 60


def test_a_separate_step_runs_only_when_named_or_rehearsed(tmp_path, monkeypatch):
    """A step of its own call (`kernels`) is left out of a plain device run, runs alone under `--only`,
    and runs with the others in the rehearsal (CI: every step, this one too, must say "ok")."""
    steps = [
        check.Step("plain", [sys.executable, "-c", ""], scaled(30)),
        check.Step("own", [sys.executable, "-c", ""], scaled(30), separate=True),
    ]
    monkeypatch.setattr(check, "steps", lambda device, rehearse, work: steps)
    ran = {}
    for name, extra in (("plain", []), ("only", ["--only", "own"]), ("rehearse", ["--rehearse"])):
        assert check.main(["--out", str(tmp_path / name), "--device", "cpu", *extra]) == 0
        ran[name] = list(json.loads((tmp_path / name / "check.json").read_text())["steps"])
    assert ran == {"plain": ["plain"], "only": ["own"], "rehearse": ["plain", "own"]}


def test_the_kernels_step_is_a_call_of_its_own_that_ends_inside_its_box():
    """kernels.py at the device's sizes (Table 1's models, widths 10 and 100, every TF32 setting: its defaults)
    in a call of its own, starting no combination after 150 s of its 180 s box; tiny sizes in the rehearsal."""
    device = {s.name: s for s in check.steps("cuda", False, Path("/w"))}
    rehearsal = {s.name: s for s in check.steps("cpu", True, Path("/w"))}
    assert [name for name, s in device.items() if s.separate] == ["kernels"]
    assert rehearsal["kernels"].separate
    for step in (device["kernels"], rehearsal["kernels"]):
        assert str(check.HERE / "kernels.py") in step.command
        assert step.figures == Path("/w") / "kernels.json" and str(step.figures) in step.command
    command = device["kernels"].command
    assert not {"--widths", "--batch", "--tf32", "--models"} & set(command)  # the paper's sizes, every setting
    assert float(command[command.index("--seconds") + 1]) + 25 <= device["kernels"].timeout <= 180
    tiny = rehearsal["kernels"].command
    assert tiny[tiny.index("--widths") + 1] == "2,3" and tiny[tiny.index("--batch") + 1] == "4"
