"""Round checkpoints (pflbench/storage/checkpoint.py, Algorithm.state_dict): a cell interrupted after round k
and resumed from its checkpoint in a fresh Federation and algorithm gives the uninterrupted run's
metrics and summary bit for bit, for every registered algorithm; unusable checkpoints are set aside."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from cells import small_cell
from checkpoint_helpers import differences, interrupted_and_resumed, uninterrupted
from pflbench.simulator.execution import ExecutionOptions
from pflbench.algorithm import ALGORITHMS, StateError, get_algorithm
from pflbench.storage.checkpoint import CHECKPOINT, CheckpointPolicy, Checkpointer, list_checkpoints, read_header
from pflbench.simulator.rounds import run_cell

get_algorithm("fedavg")  # registers the built-in algorithms
BATCHED = sorted(name for name, cls in ALGORITHMS.items() if cls.capabilities.batched)
IMAGES = dict(dataset="synthetic-images", dataset_options={"num_samples": 200, "channels": 3, "size": 32})


def _hp(name: str) -> dict:
    """Small local work and models for the slow methods (each declares its own: `Algorithm.quick_hp`)."""
    return dict(ALGORITHMS.get(name).quick_hp)


def assert_resumes_bit_identical(cell, tmp_path, at: int, **run):
    full = uninterrupted(cell, tmp_path, **run)
    resumed, notes = interrupted_and_resumed(cell, tmp_path / "store" / "cell", tmp_path, at=at, **run)
    assert notes == [f"resumed at round {at} of {cell.rounds}"]
    assert resumed.summary["resumed_from_round"] == at
    assert full.status == "finished"
    assert differences(full, resumed) == []


# ---- the registry-wide test: an algorithm without the state it needs fails here ------------------------


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_algorithm_resumes_bit_identical_on_the_loop_path(name, tmp_path):
    cell = small_cell(algorithm=name, rounds=4, eval_every=2, hp=_hp(name), dataset_options={"num_samples": 600})
    assert_resumes_bit_identical(cell, tmp_path, at=3, execution=ExecutionOptions(client_batching="off"))


@pytest.mark.parametrize("name", BATCHED)
def test_every_batched_algorithm_resumes_bit_identical_on_the_batched_path(name, tmp_path):
    cell = small_cell(algorithm=name, rounds=3, hp=_hp(name), dataset_options={"num_samples": 600})
    assert_resumes_bit_identical(cell, tmp_path, at=2, execution=ExecutionOptions(client_batching="on"))


@pytest.mark.parametrize("name", ["local", "mh-pfedhngd"])
def test_heterogeneous_models_resume_bit_identical(name, tmp_path):
    """mh-cnn and VGG8 (whose dropout draws from torch's global generator: checkpointed too)."""
    cell = small_cell(algorithm=name, model="mh-cnn,vgg8", clients=4, rounds=3, hp=_hp(name), lr=0.01, **IMAGES)
    assert_resumes_bit_identical(cell, tmp_path, at=2)


def test_fedmn_on_images_resumes_bit_identical(tmp_path):
    cell = small_cell(algorithm="fedmn", clients=3, rounds=3, hp=_hp("fedmn"), **IMAGES)
    assert_resumes_bit_identical(cell, tmp_path, at=1)


@pytest.mark.parametrize("name", ["fedavg", "pfedhn"])
def test_system_privacy_and_unseen_clients_resume_bit_identical(name, tmp_path):
    """Dropped uploads, stragglers, DP noise with its release counts, newcomers scored each eval."""
    cell = small_cell(
        algorithm=name,
        clients=8,
        participation=0.6,
        rounds=4,
        eval_every=2,
        hp=_hp(name),
        system={"dropout": 0.3, "stragglers": 0.4, "straggler_work": 0.5},
        privacy={"epsilon": 8.0},
        unseen_fraction=0.25,
    )
    assert_resumes_bit_identical(cell, tmp_path, at=3)


@pytest.mark.parametrize("name", ["ditto", "perfedavg"])
def test_finetune_epochs_cells_resume_bit_identical(name, tmp_path):
    cell = small_cell(algorithm=name, rounds=3, finetune_epochs=1, hp=_hp(name))
    assert_resumes_bit_identical(cell, tmp_path, at=2)


# ---- the contract fails loudly, and the registry test has teeth ---------------------------------------


class _WithModule(ALGORITHMS.get("fedavg")):
    def setup(self):
        super().setup()
        self.extra = nn.Linear(2, 2)


class _WithGenerator(ALGORITHMS.get("fedavg")):
    def setup(self):
        super().setup()
        self.draws = torch.Generator().manual_seed(1)


@pytest.mark.parametrize("cls, attribute", [(_WithModule, "extra"), (_WithGenerator, "draws")])
def test_state_the_contract_cannot_capture_fails_loudly(cls, attribute, tmp_path):
    """Undeclared, the attribute is named; declared as a plain value, its type is; in state_objects, saved."""
    from cells import federation

    alg = cls(federation(small_cell(), tmp_path), cls.parse_hyperparams({}))
    alg.setup()
    with pytest.raises(StateError, match=rf"{cls.__name__} \(.*\) sets {attribute}, declared in none of `state`"):
        alg.state_dict()
    as_value = type("AsValue", (cls,), {"state": (*cls.state, attribute)})(alg.engine, alg.hp)
    as_value.setup()
    with pytest.raises(StateError, match=rf"AsValue\.{attribute} holds a .*state_objects"):
        as_value.state_dict()
    declared = type("Declared", (cls,), {"state_objects": (attribute,)})(alg.engine, alg.hp)
    declared.setup()
    assert attribute in declared.state_dict()["objects"]


class _ModuleAsValue(_WithModule):
    state = (*_WithModule.state, "extra")  # declared, but as a value: a checkpoint cannot capture it


def test_a_cell_whose_algorithm_breaks_the_contract_runs_on_without_checkpoints_and_says_so(tmp_path, monkeypatch):
    import pflbench.simulator.rounds as federation_module

    monkeypatch.setattr(federation_module, "get_algorithm", lambda name: _ModuleAsValue)
    cell = small_cell(rounds=3)
    notes = []
    checkpointer = Checkpointer(tmp_path / "cell", cell, CheckpointPolicy(every=1, minutes=0), note=notes.append)
    result = run_cell(cell, data_root=tmp_path, checkpointer=checkpointer)
    assert result.status == "finished" and result.summary["checkpoints_written"] == 0
    assert "_ModuleAsValue.extra holds a" in result.summary["checkpoint_error"]
    assert len(notes) == 1 and notes[0].startswith("no checkpoints for this cell: _ModuleAsValue.extra holds a")
    # undeclared, the attribute fails the cell at the end of the round that set it (pflbench.algorithm)
    monkeypatch.setattr(federation_module, "get_algorithm", lambda name: _WithModule)
    with pytest.raises(StateError, match=r"_WithModule \(.*\) sets extra, declared in none of"):
        run_cell(
            cell,
            data_root=tmp_path,
            checkpointer=Checkpointer(tmp_path / "other", cell, CheckpointPolicy(every=1, minutes=0)),
        )


def test_state_left_out_of_the_checkpoint_is_caught_by_the_resume_comparison(tmp_path, monkeypatch):
    """An algorithm whose round counter is (wrongly) declared rebuilt by setup resumes differently;
    the comparison the registry test makes reports it."""
    base = ALGORITHMS.get("fedavg")

    class Forgetful(base):
        state_rebuilt = ("counter",)

        def setup(self):
            super().setup()
            self.counter = 0

        def local_train(self, rnd, state):
            self.counter += 1
            return self.engine.train(rnd, rnd.clients, state, epochs=self.counter).state

    import pflbench.simulator.rounds as federation_module

    monkeypatch.setattr(federation_module, "get_algorithm", lambda name: Forgetful)
    cell = small_cell(rounds=4)
    full = uninterrupted(cell, tmp_path)
    resumed, _ = interrupted_and_resumed(cell, tmp_path / "store" / "cell", tmp_path, at=2)
    assert any(d.startswith("metrics.accuracy") or d.startswith("metrics.loss") for d in differences(full, resumed))


# ---- the file: set aside when it cannot be used --------------------------------------------------------


def _checkpoint_after(cell, folder, tmp_path, at: int):
    from checkpoint_helpers import Interrupted, InterruptingCheckpointer

    try:
        run_cell(cell, data_root=tmp_path, checkpointer=InterruptingCheckpointer(folder, cell, at=at))
    except Interrupted:
        return folder / CHECKPOINT
    raise AssertionError("not interrupted")


def _damage(path):
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def _rewrite_header(path, **changes):
    head, _, body = path.read_bytes().partition(b"\n")
    magic, _, text = head.partition(b" ")
    path.write_bytes(magic + b" " + json.dumps({**json.loads(text), **changes}).encode() + b"\n" + body)


def _other_code(path):
    _rewrite_header(path, code="0" * 16 + "-elsewhere")


def _other_data(path):
    _rewrite_header(path, dataset_checksum="re-prepared")


def _truncate(path):
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize(
    "spoil, reason",
    [
        (_damage, "damaged: checksum differs"),
        (_truncate, "damaged: "),
        (_other_code, "from another code version"),
        (_other_data, "from other data"),
    ],
)
def test_an_unusable_checkpoint_is_set_aside_with_its_reason_and_the_cell_starts_over(spoil, reason, tmp_path):
    cell = small_cell(rounds=3)
    folder = tmp_path / "store" / "cell"
    spoil(_checkpoint_after(cell, folder, tmp_path, at=2))
    notes = []
    result = run_cell(cell, data_root=tmp_path, checkpointer=Checkpointer(folder, cell, note=notes.append))
    assert len(notes) == 1 and notes[0].startswith(f"checkpoint set aside ({reason}")
    assert result.summary["resumed_from_round"] is None
    assert differences(uninterrupted(cell, tmp_path), result) == []
    kept = list((tmp_path / "store" / "_damaged").glob("cell-checkpoint-*.pt"))
    assert len(kept) == 1 and kept[0].with_suffix(".why.txt").read_text().startswith(reason)
    assert not (folder / CHECKPOINT).exists()


def test_a_checkpoint_of_another_configuration_or_execution_path_is_set_aside(tmp_path):
    cell = small_cell(rounds=3)
    folder = tmp_path / "store" / "cell"
    _checkpoint_after(cell, folder, tmp_path, at=2)
    notes = []
    other = small_cell(rounds=3, lr=0.02)
    run_cell(other, data_root=tmp_path, checkpointer=Checkpointer(folder, other, note=notes.append))
    assert notes[0].startswith("checkpoint set aside (from another configuration")
    _checkpoint_after(cell, folder, tmp_path, at=2)
    notes.clear()
    run_cell(
        cell,
        data_root=tmp_path,
        execution=ExecutionOptions(client_batching="on"),
        checkpointer=Checkpointer(folder, cell, note=notes.append),
    )
    assert notes[0].startswith("checkpoint set aside (from another execution path")


def test_a_state_that_does_not_fit_the_algorithm_is_set_aside_and_the_algorithm_starts_fresh(tmp_path):
    """A payload written by another algorithm class under the same header (e.g. an edited plugin)."""
    cell = small_cell(algorithm="fedavg", rounds=3)
    folder = tmp_path / "store" / "cell"
    _checkpoint_after(small_cell(algorithm="pfedhn", rounds=3, hp=_hp("pfedhn")), folder, tmp_path, at=2)
    path = folder / CHECKPOINT
    head, _, body = path.read_bytes().partition(b"\n")  # give it fedavg's identity
    magic, _, text = head.partition(b" ")
    header = json.loads(text)
    probe = Checkpointer(folder, cell)
    from pflbench.storage.code_version import code_version
    from pflbench.config import cell_hash

    header.update(hash=cell_hash(cell), code=code_version(ALGORITHMS.get("fedavg")))
    path.write_bytes(magic + b" " + json.dumps(header).encode() + b"\n" + body)
    notes = []
    result = run_cell(cell, data_root=tmp_path, checkpointer=Checkpointer(folder, cell, note=notes.append))
    assert notes[0].startswith("checkpoint set aside (does not fit this algorithm (StateError"), notes
    assert differences(uninterrupted(cell, tmp_path), result) == []
    del probe


# ---- when checkpoints are written ----------------------------------------------------------------------


def test_the_policy_writes_every_n_rounds_and_by_time_but_never_after_the_last_round():
    by_rounds = CheckpointPolicy(every=2, minutes=0)
    assert [r for r in range(1, 8) if by_rounds.due(r, 7, 0.0)] == [2, 4, 6]
    by_time = CheckpointPolicy(every=0, minutes=1)
    assert not by_time.due(3, 10, 59.0) and by_time.due(3, 10, 60.0) and not by_time.due(10, 10, 600.0)
    with pytest.raises(ValueError, match="whole number of rounds"):
        CheckpointPolicy(every=-1)


def test_a_short_cell_under_the_default_policy_writes_no_checkpoint(tmp_path):
    cell = small_cell(rounds=3)
    checkpointer = Checkpointer(tmp_path / "cell", cell)
    result = run_cell(cell, data_root=tmp_path, checkpointer=checkpointer)
    assert result.summary["checkpoints_written"] == 0 and result.summary["checkpoint_seconds"] == 0.0
    assert not (tmp_path / "cell" / CHECKPOINT).exists()


def test_checkpoints_keep_only_the_latest_and_record_their_cost(tmp_path):
    cell = small_cell(rounds=5)
    checkpointer = Checkpointer(tmp_path / "store" / "cell", cell, CheckpointPolicy(every=2, minutes=0))
    result = run_cell(cell, data_root=tmp_path, checkpointer=checkpointer)
    assert result.summary["checkpoints_written"] == 2 and result.summary["checkpoint_seconds"] > 0
    assert [p.name for p in (tmp_path / "store" / "cell").iterdir()] == [CHECKPOINT]
    assert read_header(tmp_path / "store" / "cell" / CHECKPOINT)["round"] == 4
    listed = list_checkpoints(tmp_path / "store")
    assert [(e["hash"], e["round"], e["rounds"], e["problem"]) for e in listed] == [
        ("cell", 4, 5, "from another configuration")
    ]


def test_checkpoints_from_a_chosen_round_are_kept_beside_the_store_cells(tmp_path):
    """`keep_from`: every checkpoint written from that round on is also copied, byte for byte, to
    <store>/_kept/<hash>/round-NNNN.pt, and stays after the cell finished; the store's cells ignore it."""
    from pflbench.run.cell import cell_checkpointer
    from pflbench.run.options import RunOptions
    from pflbench.storage.store import KEPT, Store, load_store, store_problems

    cell = small_cell(rounds=6)
    options = RunOptions(results=tmp_path / "store", checkpoint_every=1, checkpoint_minutes=0, keep_checkpoints_from=3)
    store = Store(options.results)
    checkpointer = cell_checkpointer(cell, options)
    result = run_cell(cell, data_root=tmp_path, checkpointer=checkpointer)
    store.write(cell, result)
    kept = tmp_path / "store" / KEPT / store.cell_dir(cell).name
    assert sorted(p.name for p in kept.iterdir()) == ["round-0003.pt", "round-0004.pt", "round-0005.pt"]
    assert [read_header(kept / f"round-000{r}.pt")["round"] for r in (3, 4, 5)] == [3, 4, 5]
    assert (kept / "round-0005.pt").read_bytes() == store.checkpoint_path(cell).read_bytes()  # the latest, copied
    assert list(load_store(tmp_path / "store")["hash"]) == [store.cell_dir(cell).name] and not store_problems(
        tmp_path / "store"
    )
    with pytest.raises(ValueError, match="keep checkpoints from must be a round >= 1"):
        CheckpointPolicy(keep_from=-1)


def test_store_check_lists_the_cells_with_a_checkpoint_and_its_round(tmp_path, capsys):
    from pflbench.cli import main
    from pflbench.storage.store import Store

    cell = small_cell(rounds=5)
    store = Store(tmp_path / "results")
    _checkpoint_after(cell, store.cell_dir(cell), tmp_path, at=3)
    assert store.checkpoint_path(cell).exists()
    main(["store", "check", "--results", str(store.root)])
    out = capsys.readouterr().out
    assert f"checkpoint: {store.cell_dir(cell).name} at round 3 of 5" in out, out
    store.remove_checkpoint(cell)
    main(["store", "check", "--results", str(store.root)])
    assert "checkpoint:" not in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["truncated", "bit flipped"])
def test_store_check_calls_a_truncated_or_bit_flipped_checkpoint_damaged(tmp_path, capsys, damage):
    """Its size and checksum are verified (the header alone reads as fine): the next run would set it aside."""
    from pflbench.cli import main
    from pflbench.storage.store import Store

    cell = small_cell(rounds=5)
    store = Store(tmp_path / "results")
    path = _checkpoint_after(cell, store.cell_dir(cell), tmp_path, at=3)
    assert main(["store", "check", "--results", str(store.root)]) == 0
    assert "0 of them damaged" in capsys.readouterr().out
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        del data[len(data) // 2 :]
    else:
        data[len(data) * 2 // 3] ^= 0x10
    path.write_bytes(bytes(data))
    assert read_header(path)["round"] == 3  # the header is intact
    assert main(["store", "check", "--results", str(store.root)]) == 1
    out = capsys.readouterr().out
    reason = "bytes of payload, the header says" if damage == "truncated" else "checksum differs"
    assert f"checkpoint: {store.cell_dir(cell).name}/{CHECKPOINT}: damaged: " in out and reason in out, out
    assert "1 round checkpoints, 1 of them damaged" in out, out


def test_run_refuses_bad_checkpoint_options_before_any_work(tmp_path, capsys):
    from pflbench.cli import main

    for option, value, message in (
        ("--checkpoint-every", "-2", "--checkpoint-every must be 0"),
        ("--checkpoint-minutes", "-1", "--checkpoint-minutes must be >= 0"),
        ("--keep-checkpoints-from", "-1", "--keep-checkpoints-from must be a round"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(["run", "benchmarks/demo.yaml", "--results", str(tmp_path / "r"), option, value])
    assert not (tmp_path / "r").exists()


def test_a_sweep_trial_writes_checkpoints_and_a_retried_trial_resumes_from_them(tmp_path, monkeypatch):
    """`run_trial` as Tune runs it, twice with one trial id (Tune's retry of a lost trial)."""
    from types import SimpleNamespace

    from ray import tune

    from pflbench.tuning.trial import run_trial

    reports = []
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp_path))
    monkeypatch.setattr(tune, "report", lambda metrics, **_: reports.append(metrics))
    monkeypatch.setattr(tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "trial_1"))
    base = small_cell(rounds=4, eval_every=1)
    folder = tmp_path / "sweep" / "checkpoints"
    kwargs = dict(
        base=base.model_dump(mode="json"),
        cpus=1,
        data_root=str(tmp_path),
        mirror=None,
        execution=ExecutionOptions(device="cpu"),
        checkpoints={"folder": str(folder), "every": 2, "minutes": 0, "keep": True},
    )
    run_trial({"lr": 0.03}, **kwargs)
    assert read_header(folder / "trial_1" / CHECKPOINT)["round"] == 2
    first = list(reports)
    reports.clear()
    run_trial({"lr": 0.03}, **kwargs)
    assert [r["round"] for r in first] == [1, 2, 3, 4] and [r["resumed_from_round"] for r in first] == [-1] * 4
    # Resumed at round 2: the rounds up to the checkpoint reported again from it (Tune's records of them
    # may be lost with a killed driver), then rounds 3 and 4, computed anew; all as the first run's.
    assert [r["round"] for r in reports] == [1, 2, 3, 4] and [r["resumed_from_round"] for r in reports] == [2] * 4
    for column in ("round", "val_accuracy", "val_loss"):
        assert [r[column] for r in reports] == [r[column] for r in first]
    run_trial({"lr": 0.03}, **{**kwargs, "checkpoints": {**kwargs["checkpoints"], "keep": False}})
    assert not (folder / "trial_1" / CHECKPOINT).exists()


def test_the_code_versions_source_is_parsed_under_one_lock_when_a_groups_threads_read_it(monkeypatch):
    """A cell group's cells run in threads and each reads its code version: every ast.parse of it happens
    under code_version.PARSE_LOCK (two at once failed a group's cell with CPython 3.11's "AST constructor
    recursion depth mismatch"), and the threads get the same version."""
    import ast
    import threading

    from pflbench.storage import code_version

    held: list[bool] = []
    real = ast.parse

    def parse(*args, **kwargs):
        held.append(code_version.PARSE_LOCK.locked())
        return real(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)
    code_version._imported.cache_clear()
    try:
        algorithm = get_algorithm("fedavg")
        versions: list[object] = []
        threads = [
            threading.Thread(target=lambda: versions.append(sorted(code_version.source_files(algorithm))))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        code_version._imported.cache_clear()
    assert held and all(held)
    assert len(versions) == 4 and all(v == versions[0] for v in versions) and versions[0]
