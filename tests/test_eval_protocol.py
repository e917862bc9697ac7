"""Evaluation protocols: the model scored (as delivered, or after local adaptation), the round
selected (final, best mean validation accuracy — never the test split) and the averaging (mean over
clients, pooled over test samples)."""

import math

import numpy as np
import pandas as pd
import pytest

from pflbench.config import CellConfig, cell_hash
from pflbench.simulator.metrics import METRIC_COLUMNS, protocol_summary
from pflbench.simulator.rounds import run_cell
from cells import small_cell

DELIVERED = ["accuracy", "loss", "val_accuracy", "val_loss"]
ADAPTED = ["accuracy_adapted", "loss_adapted", "val_accuracy_adapted", "val_loss_adapted"]


def test_finetune_epochs_at_its_default_keeps_every_existing_cell_id():
    cell = small_cell()
    assert "finetune_epochs" not in cell.canonical_json()
    assert cell_hash(cell) == cell_hash(small_cell(finetune_epochs=0))
    assert cell_hash(cell) != cell_hash(small_cell(finetune_epochs=2))
    with pytest.raises(ValueError):
        small_cell(finetune_epochs=-1)


@pytest.mark.parametrize(
    "algorithm,hp", [("fedavg", {}), ("pfedla", {}), ("ditto", {}), ("fedbabu", {}), ("perfedavg", {})]
)
def test_adaptation_never_changes_training(tmp_path, algorithm, hp):
    """The as-delivered metrics are bit-identical with and without the adapted evaluation."""
    plain = run_cell(small_cell(algorithm=algorithm, hp=hp), data_root=tmp_path)
    adapted = run_cell(small_cell(algorithm=algorithm, hp=hp, finetune_epochs=2), data_root=tmp_path)
    assert plain.status == adapted.status == "finished"
    pd.testing.assert_frame_equal(plain.metrics[DELIVERED], adapted.metrics[DELIVERED])
    assert plain.metrics[ADAPTED].isna().all().all()
    assert adapted.metrics[ADAPTED].notna().all().all()
    assert plain.summary["final_accuracy"] == adapted.summary["final_accuracy"]
    assert "final_accuracy_adapted" not in plain.summary and "final_accuracy_adapted" in adapted.summary
    assert (adapted.rounds["adapt_time"] > 0).all() and (plain.rounds["adapt_time"] == 0).all()
    assert adapted.summary["adapt_time_total"] == pytest.approx(adapted.rounds["adapt_time"].sum())


def test_local_adapted_equals_its_next_round(tmp_path):
    """For plain local training, adaptation is the same SGD on the same data as the next round."""
    cell = small_cell(algorithm="local", rounds=3, local_epochs=1, finetune_epochs=1)
    metrics = run_cell(cell, data_root=tmp_path).metrics.set_index(["round", "client"])
    for rnd in (1, 2):
        np.testing.assert_allclose(
            metrics.loc[rnd, "accuracy_adapted"].to_numpy(), metrics.loc[rnd + 1, "accuracy"].to_numpy(), atol=1e-6
        )
        np.testing.assert_allclose(
            metrics.loc[rnd, "loss_adapted"].to_numpy(), metrics.loc[rnd + 1, "loss"].to_numpy(), rtol=1e-5
        )


def test_fedavg_adapted_beats_fedavg_as_delivered_on_a_pathological_split(tmp_path):
    cell = small_cell(algorithm="fedavg", partition_params={"classes_per_client": 2}, rounds=4, finetune_epochs=2)
    summary = run_cell(cell, data_root=tmp_path).summary
    assert summary["final_accuracy_adapted"] > summary["final_accuracy"] + 0.05, summary


@pytest.mark.parametrize(
    "cell",
    [
        CellConfig(
            algorithm="local",
            dataset="synthetic-images",
            dataset_options={"num_samples": 240, "channels": 3, "size": 32},
            partition="pathological",
            partition_params={"classes_per_client": 3},
            clients=4,
            rounds=1,
            batch_size=16,
            lr=0.05,
            model="mh-cnn,resnet10",
            finetune_epochs=1,
        ),
        CellConfig(
            algorithm="fedmn",
            dataset="synthetic-images",
            dataset_options={"num_samples": 240},
            partition="pathological",
            partition_params={"classes_per_client": 3},
            clients=3,
            rounds=2,
            batch_size=16,
            lr=0.05,
            momentum=0.9,
            finetune_epochs=1,
            hp={"dims": [16, 8], "encoder_hidden": 16, "router_x_dim": 8, "router_y_dim": 4, "router_samples": 16},
        ),
    ],
    ids=["heterogeneous-models", "fedmn"],
)
def test_adaptation_works_for_heterogeneous_models_and_fedmn(tmp_path, cell):
    plain = run_cell(cell.model_copy(update={"finetune_epochs": 0}), data_root=tmp_path)
    adapted = run_cell(cell, data_root=tmp_path)
    pd.testing.assert_frame_equal(plain.metrics[DELIVERED], adapted.metrics[DELIVERED])
    assert adapted.metrics[ADAPTED].notna().all().all()
    # adaptation trained something: the adapted losses are not the delivered ones
    assert not np.allclose(adapted.metrics["loss_adapted"], adapted.metrics["loss"])


def _metrics(test_by_round, val_by_round, test_samples=(10, 30)):
    rows = []
    for rnd, (test, val) in enumerate(zip(test_by_round, val_by_round), start=1):
        for client, (t, v) in enumerate(zip(test, val)):
            rows.append(
                {
                    "round": rnd,
                    "client": client,
                    "accuracy": t,
                    "loss": 1 - t,
                    "val_accuracy": v,
                    "val_loss": 1 - v,
                    "test_samples": test_samples[client],
                    "val_samples": 5,
                }
            )
    return pd.DataFrame(rows)


def test_best_validation_round_is_selected_on_validation_never_on_test():
    # mean test accuracy peaks at round 2, mean validation accuracy at round 3
    metrics = _metrics(
        test_by_round=[(0.5, 0.5), (0.9, 0.9), (0.6, 0.7), (0.55, 0.55)],
        val_by_round=[(0.4, 0.4), (0.5, 0.5), (0.8, 0.7), (0.6, 0.6)],
    )
    out = protocol_summary(metrics)
    assert out["bestval_round"] == 3
    assert out["bestval_accuracy"] == pytest.approx(0.65)
    assert out["best_val_accuracy"] == pytest.approx(0.75)
    assert out["final_accuracy"] == pytest.approx(0.55)
    assert out["bestval_worst10_accuracy"] == pytest.approx(0.6)
    assert out["bestval_accuracy_pooled"] == pytest.approx((0.6 * 10 + 0.7 * 30) / 40)
    assert "best_accuracy" not in out  # selection on the test split is not a protocol summary


def test_pooled_accuracy_weights_clients_by_their_test_samples():
    metrics = _metrics(test_by_round=[(1.0, 0.5)], val_by_round=[(0.1, 0.1)], test_samples=(10, 30))
    out = protocol_summary(metrics)
    assert out["final_accuracy"] == pytest.approx(0.75)
    assert out["final_accuracy_pooled"] == pytest.approx((10 + 15) / 40)


def test_adapted_summaries_select_on_the_adapted_validation_accuracy_and_skip_failed_rounds():
    metrics = _metrics(test_by_round=[(0.5, 0.5)] * 3, val_by_round=[(0.5, 0.5)] * 3)
    metrics["accuracy_adapted"] = [0.6, 0.6, math.nan, math.nan, 0.7, 0.9]
    metrics["val_accuracy_adapted"] = [0.9, 0.9, math.nan, math.nan, 0.8, 0.8]
    metrics["loss_adapted"] = metrics["val_loss_adapted"] = 0.0
    out = protocol_summary(metrics, "_adapted")
    assert out["final_accuracy_adapted"] == pytest.approx(0.8)
    assert out["bestval_round_adapted"] == 1 and out["bestval_accuracy_adapted"] == pytest.approx(0.6)
    assert protocol_summary(metrics.drop(columns=["accuracy_adapted"]), "_adapted") == {}  # an old store


def test_a_run_records_the_protocol_columns_and_summaries(tmp_path):
    result = run_cell(small_cell(rounds=2, finetune_epochs=1), data_root=tmp_path)
    assert list(result.metrics.columns) == METRIC_COLUMNS
    assert (result.metrics["test_samples"] > 0).all()
    for key in (
        "final_accuracy",
        "final_accuracy_pooled",
        "bestval_accuracy",
        "bestval_round",
        "final_accuracy_adapted",
        "bestval_accuracy_adapted",
        "bestval_round_adapted",
        "final_accuracy_adapted_pooled",
        "best_accuracy",
        "best_round",
    ):
        assert key in result.summary, key
    assert result.summary["adapt_time_total"] > 0 and result.summary["adapt_diverged_rounds"] == []
