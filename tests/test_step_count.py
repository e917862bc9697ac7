"""benchmarks/gpu/step_count.py counts each row's work by running it; paper_slice.py projects the tables
from those counts. The counts must be what the rows' plans say: FedAvg one step a batch, pFedMe K, pFedHN
its fixed inner steps whatever the epochs, FedRep head and body epochs whatever the cell's."""

import json
import math
import sys
from pathlib import Path

import pytest

from pflbench.simulator.resolve import resolve
from pflbench.simulator.rounds import prepare_cell
from tests.cells import small_cell

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import paper_slice  # noqa: E402
import step_count  # noqa: E402

B = 16


@pytest.fixture(scope="module")
def cell_and_batches(tmp_path_factory):
    """A 2-client Synthetic cell evaluated with adaptation, and its clients' batches an epoch on average."""
    cell = resolve(
        small_cell(
            clients=2,
            batch_size=B,
            finetune_epochs=1,
            val_fraction=0.0,
            model="mlp",
            dataset_options={"num_samples": 400},
        )
    )
    _, splits = prepare_cell(cell, tmp_path_factory.mktemp("data", numbered=False))
    train = [len(t) for t in splits.train]
    test = [len(t) for t in splits.test]
    per_epoch = sum(math.ceil(n / B) * B for n in train) / len(train)
    return cell, per_epoch, sum(test) / len(test), tmp_path_factory.getbasetemp() / "data"


def count(cell, algorithm: str, root, **hp):
    return step_count.count_row(resolve(cell.model_copy(update={"algorithm": algorithm, "hp": hp})), root)


def test_fedavg_counts_one_training_step_per_sample_of_each_epoch_and_scores_test_twice(cell_and_batches):
    cell, per_epoch, test, root = cell_and_batches
    counts = count(cell, "fedavg", root)
    assert counts["round_grad"] == [0.0, per_epoch]  # a + b x local epochs
    assert counts["eval_grad"] == [0.0, per_epoch]  # the adaptation: b x its epochs
    assert counts["round_forward"] == [0.0, 0.0]
    assert counts["eval_forward"] == [2 * test, 0.0]  # as delivered and after adaptation


def test_pfedme_counts_k_inner_steps_a_batch_and_pfedhn_its_inner_steps_whatever_the_epochs(cell_and_batches):
    cell, per_epoch, _, root = cell_and_batches
    assert count(cell, "pfedme", root, k=3)["round_grad"] == [0.0, 3 * per_epoch]
    assert count(cell, "pfedhn", root, inner_steps=7)["round_grad"] == [7 * B, 0.0]
    assert count(cell, "fedrep", root, head_epochs=2, body_epochs=1)["round_grad"] == [3 * per_epoch, 0.0]


def test_the_projection_charges_each_row_its_counted_work(cell_and_batches):
    cell, per_epoch, _, _ = cell_and_batches
    key = step_count.setting_key(cell)
    counts = {
        key: {
            "round_grad": [0.0, 100.0],
            "round_forward": [0.0, 0.0],
            "eval_grad": [50.0, 0.0],
            "eval_forward": [30.0, 0.0],
        }
    }
    ten = cell.model_copy(update={"clients": 10, "participation": 0.5, "local_epochs": 3, "eval_every": 5})
    # 20 rounds x 5 joining x 100 x 3 epochs, and 4 evaluations x 10 clients x (50 + 30 / 3)
    assert paper_slice.counted_work(ten, 20, counts) == 20 * 5 * 300 + 4 * 10 * 60
    assert paper_slice.counted_work(ten.model_copy(update={"batch_size": 8}), 20, counts) is None


def test_the_stored_counts_cover_every_cell_of_both_tables():
    """step_counts.json (committed) has a count for every full-scale cell of table1.yaml and table2.yaml,
    and a stored H100 slice re-projects from it with no setting left uncounted."""
    stored = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "h100-2026-11-26.json"
    result = paper_slice.reproject(str(stored), paper_slice.load_counts(None))
    for projection in (result["projection"], result["projection_table2"]):
        assert projection["cells"] == 240 and projection["uncounted_settings"] == []
        assert projection["hours"] > 0
    assert json.loads(paper_slice.COUNTS.read_text())["counts"]
