"""kNN-Per (Marfoq, Neglia, Vidal & Kameni, ICML 2022, "Personalized Federated Learning through Local
Memorization").

What the paper says: train one global model by FedAvg; each client then keeps a local memory, a datastore
of (representation, label) pairs of its own training samples under the global model's feature extractor,
and predicts by interpolating the global model's output with a k-nearest-neighbours classifier over its
datastore: p(y|x) = lambda p_kNN(y|x) + (1 - lambda) p_model(y|x), where p_kNN weighs each of the k
neighbours' labels by a Gaussian kernel of its distance. lambda is a per-client choice.

Checked against the official code (github.com/omarfoq/knn-per, commit ee17520: client.py KNNPerClient
.gather_knn_outputs and .evaluate, datastore.py, eval_knnper.py; the lines run on the same tensors with
faiss: tests/test_knnper.py). Its defaults: k = 7 (paper_experiments/*/heterogeneity_effect.sh), kernel
exp(-d^2 / (dim * scale)) with scale 1.0 (`--kernel_length_scale`), squared L2 distances (faiss
IndexFlatL2), the datastore holding every training sample (capacity -1), lambda on a grid of step 0.01.

Departures, each for a reason:
- lambda is chosen per client on its validation split (the best accuracy on the grid, the smallest
  lambda among ties), never on the test split (a cell with val_fraction 0 must fix `weight`: refused
  otherwise, before anything runs); the official evaluation scores every lambda of the grid on
  the test split (eval_knnper.py eval_knnper_grid) and reports from those scores. `weight` fixes lambda
  instead.
- Probabilities are interpolated, as the paper writes. The official `--interpolate_logits` is declared
  with default="store_true" where action="store_true" was meant (utils/args.py:210-212), so it is always
  on: by default the official code mixes the model's logits (client.py compute_features_and_model_outputs,
  apply_softmax = not interpolate_logits) with the kNN's probabilities. `interpolate: logits` reproduces
  that for comparison.
- The representation is the input of the model's last linear layer (pflbench.kit.representation); the
  official code hooks its MobileNet's `features` output (before pooling and the classifier).
- The datastore is the client's train split, computed afresh at every evaluation under the model being
  evaluated (the global model; after local adaptation, the adapted one), so evaluation writes nothing.
- The loss reported is the negative log of the interpolated probability of the label (clamped at 1e-12);
  accuracy as the official (argmax of the interpolation).
- Training is FedAvg's, unchanged (batched, groupable, BatchNorm statistics averaged); the kNN part costs
  one forward pass over each client's train and evaluated splits per evaluation and is a loop over clients.
- Newcomers: the global model with their own train split as datastore (the paper's new clients).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pflbench.algorithm import ALGORITHMS, Card, Hyperparams, Models, Refusal, Scores, Serving
from pflbench.engine import Engine
from pflbench.fedavg import FedAvg
from pflbench.kit.representation import Split
from pflbench.simulator.training import State

if TYPE_CHECKING:
    from pflbench.config import CellConfig


class KNNPerHP(Hyperparams):
    k: int = Field(7, ge=1)  # neighbours (official scripts: 7)
    scale: float = Field(1.0, gt=0.0)  # kernel length scale (official --kernel_length_scale 1.0)
    weight: float | None = Field(None, ge=0.0, le=1.0)  # lambda; None: per client on its validation split
    grid_step: float = Field(0.01, gt=0.0, le=1.0)  # the lambda grid's step (official resolution 0.01)
    interpolate: Literal["probabilities", "logits"] = "probabilities"  # the paper's; "logits": the official default


@ALGORITHMS.register(
    "knn-per",
    card=Card(
        display_name="kNN-Per",
        family="personal layers",
        paper="Marfoq, Neglia, Vidal & Kameni, ICML 2022",
        personalizes="the prediction: the FedAvg model's output interpolated with a k-nearest-neighbours "
        "classifier over the client's own training representations",
        reduces_to={"fedavg": "kNN-Per trains FedAvg's model; with lambda 0 on every client it predicts as FedAvg"},
    ),
)
class KNNPer(FedAvg[KNNPerHP]):
    state_rebuilt = ("_split", "_features")

    search_space = {"k": ("int", 1, 50), "scale": ("loguniform", 0.1, 10.0)}

    @classmethod
    def cell_refusal(cls, cell: CellConfig) -> Refusal | None:
        """lambda is chosen on each client's validation split: a cell without one must fix it."""
        if cell.val_fraction == 0 and cell.hp.get("weight") is None:
            return Refusal(
                ("val_fraction", "hp"),
                (
                    f"algorithm {cls.name!r} chooses each client's lambda on its validation split, but val_fraction is 0; "
                    f"give val_fraction > 0 (e.g. 0.1) or a fixed hp.weight in [0, 1]"
                ),
            )
        return None

    def setup(self) -> None:
        super().setup()
        self._split = Split.of(self.engine.model)
        self._features = self._split.features_model()

    def evaluate(self, serving: Serving, models: Models, splits: tuple[str, ...]) -> Scores:
        population = serving.clients
        assert isinstance(models, dict)  # one architecture (heterogeneous cells are refused): a State
        state = models
        scores = {
            s: (
                torch.full((population.num_clients,), float("nan"), device=population.device),
                torch.full((population.num_clients,), float("nan"), device=population.device),
            )
            for s in splits
        }
        for c in range(population.num_clients):
            model = {n: t[c : c + 1] for n, t in state.items()}
            keys, _, key_labels = self._outputs(population, model, c, "train")
            mixed = {}
            for split in {*splits, *(("val",) if self.hp.weight is None and "val" in population.split_names else ())}:
                feats, outputs, labels = self._outputs(population, model, c, split)
                if len(labels):
                    mixed[split] = (
                        knn_probabilities(feats, keys, key_labels, population.num_classes, self.hp.k, self.hp.scale),
                        outputs,
                        labels,
                    )
            weight = self.hp.weight if self.hp.weight is not None else self._chosen_weight(mixed.get("val"))
            for split in splits:
                if split in mixed:
                    knn, outputs, labels = mixed[split]
                    p = weight * knn + (1 - weight) * outputs
                    scores[split][0][c] = (p.argmax(1) == labels).float().mean()
                    scores[split][1][c] = -torch.log(p.gather(1, labels[:, None]).clamp_min(1e-12)).mean()
        return scores

    def _outputs(self, population: Engine, model: State, client: int, split: str) -> tuple[Tensor, Tensor, Tensor]:
        """(features [n, d], model outputs [n, C] (probabilities, or logits), labels [n]) of `client`'s `split`."""
        inputs, labels = population.data(population.sample_ids(client, split))
        with torch.no_grad():
            feats = self._features.forward(self._split.body_state(model), inputs.unsqueeze(0), train=False)
            logits = population.model.forward(model, inputs.unsqueeze(0), train=False)[0]
        outputs = logits if self.hp.interpolate == "logits" else F.softmax(logits, dim=1)
        return feats[0], outputs, labels

    def _chosen_weight(self, validation: tuple[Tensor, Tensor, Tensor] | None) -> float:
        """The grid's lambda of best validation accuracy (the smallest among ties); 0 without validation samples."""
        if validation is None:
            return 0.0
        knn, outputs, labels = validation
        grid = torch.arange(0.0, 1.0 + 1e-6, self.hp.grid_step, device=knn.device, dtype=knn.dtype)
        mixed = grid[:, None, None] * knn + (1 - grid[:, None, None]) * outputs  # [G, n, C]
        accuracy = (mixed.argmax(2) == labels).float().mean(1)
        return float(grid[int(torch.nonzero(accuracy == accuracy.max())[0])])


def knn_probabilities(queries: Tensor, keys: Tensor, key_labels: Tensor, classes: int, k: int, scale: float) -> Tensor:
    """p_kNN [n, C]: each query's k nearest keys (squared L2), weighted by exp(-d^2 / (dim * scale)),
    their similarity per label over the total (client.py gather_knn_outputs)."""
    k = min(k, len(keys))
    if k == 0:
        return torch.full((len(queries), classes), 1.0 / classes, device=queries.device)
    distances = (queries.pow(2).sum(1, keepdim=True) - 2 * queries @ keys.T + keys.pow(2).sum(1)).clamp_min(0)
    nearest, index = distances.topk(k, dim=1, largest=False)
    similarities = torch.exp(-nearest / (queries.shape[1] * scale))
    votes = torch.zeros(len(queries), classes, device=queries.device, dtype=queries.dtype)
    votes.scatter_add_(1, key_labels[index], similarities)
    return votes / similarities.sum(1, keepdim=True).clamp_min(torch.finfo(votes.dtype).tiny)  # all underflowed: 0
