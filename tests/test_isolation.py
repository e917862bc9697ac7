"""Evaluation and newcomers never touch training (issue 29, items 1 and 7).

- Every registered algorithm gives bit-identical metrics and bytes at the rounds both runs evaluate,
  whether it is evaluated every round or every third one: evaluating (`personalized`, `evaluate`,
  local adaptation, artifacts, serving newcomers) writes nothing that training reads.
- Newcomers' raw inputs (before normalisation) and labels can be replaced by garbage without
  changing one bit of training, for algorithms of every family.
"""
import pandas as pd
import pytest
import torch

from pflbench.algorithm import ALGORITHMS, get_algorithm
from pflbench.config import CellConfig
from pflbench.federation import run_cell

get_algorithm("fedavg")  # registers the built-in algorithms
REGISTRY = sorted(ALGORITHMS.names())
MH = {"hidden_dim": 4, "embedding_dim": 8, "server_updates": "per_round"}
# Small local work and models for the slow methods, so the registry runs in well under a minute.
# FedMN: gates start near 0 (gate_bias_init 0), so a routing fixed by evaluation is not "every
# module" and decides what `configure` sends (with the default bias 2 every early routing is every
# module, and the defect of issue 29 item 1 does not show in bytes or metrics).
QUICK_HP = {"pfedhn": {"inner_steps": 2}, "pfedhn-pc": {"inner_steps": 2}, "fedrep": {"head_epochs": 1},
            "fedbabu": {"finetune_epochs": 1}, "mh-pfedhn": MH, "mh-pfedhngd": MH,
            "fedmn": {"dims": [16, 8], "encoder_hidden": 16, "router_x_dim": 8, "router_y_dim": 8,
                      "router_samples": 16, "gate_bias_init": 0.0}}
ROUNDS, EVERY = 6, 3
SCORES = ["accuracy", "loss", "val_accuracy", "val_loss", "accuracy_adapted", "loss_adapted",
          "val_accuracy_adapted", "val_loss_adapted", "test_samples", "val_samples", "bytes_down", "bytes_up"]


def _setting(name: str) -> tuple[CellConfig, str]:
    """The cell every algorithm runs here, and what it leaves out of the setting and why ("" if nothing).
    Participation 0.5 of the trained clients, newcomers held out, local adaptation at every evaluation."""
    cls = get_algorithm(name)
    cell = CellConfig(algorithm=name, dataset="synthetic", dataset_options={"num_samples": 600},
                      partition="pathological", partition_params={"classes_per_client": 3}, clients=8,
                      participation=0.5, unseen_fraction=0.25, finetune_epochs=1, rounds=ROUNDS, local_epochs=1,
                      batch_size=16, lr=0.05, seed=1, eval_every=1, hp=QUICK_HP.get(name, {}))
    if cls.newcomers_refused:  # said, not skipped: the rest of the setting still runs
        return cell.model_copy(update={"unseen_fraction": 0.0}), f"no newcomers: {cls.newcomers_refused}"
    return cell, ""


def test_the_setting_covers_the_whole_registry():
    """Nothing is left out silently: every registered algorithm is a case below, and each one that
    cannot run part of the setting says why."""
    assert REGISTRY == sorted(ALGORITHMS.names()) and len(REGISTRY) >= 20
    for name in REGISTRY:
        cell, left_out = _setting(name)
        assert bool(left_out) == (cell.unseen_fraction == 0.0)


@pytest.mark.parametrize("name", REGISTRY)
def test_evaluating_more_often_changes_nothing_of_training(name, tmp_path):
    cell, _ = _setting(name)
    often = run_cell(cell, data_root=tmp_path)
    rarely = run_cell(cell.model_copy(update={"eval_every": EVERY}), data_root=tmp_path)
    assert often.status == rarely.status == "finished", (often.error, rarely.error)
    both = list(range(EVERY, ROUNDS + 1, EVERY))
    assert sorted(set(rarely.metrics["round"])) == both and sorted(set(often.metrics["round"])) == list(range(1, ROUNDS + 1))
    keys = ["round", "client"] + (["newcomer"] if "newcomer" in often.metrics else [])

    def at_common_rounds(metrics: pd.DataFrame) -> pd.DataFrame:
        rows = metrics[metrics["round"].isin(both)]
        return rows.sort_values(keys).reset_index(drop=True)[keys + SCORES]

    pd.testing.assert_frame_equal(at_common_rounds(often.metrics), at_common_rounds(rarely.metrics),
                                  check_exact=True)
    pd.testing.assert_frame_equal(often.rounds[["round", "clients", "bytes_down", "bytes_up"]],
                                  rarely.rounds[["round", "clients", "bytes_down", "bytes_up"]], check_exact=True)
    assert not often.metrics[SCORES[:4]].isna().any().any()
