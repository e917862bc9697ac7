"""FedPer (Arivazhagan et al., 2019, "Federated Learning with Personalization Layers"): the network
is split into base layers, trained by FedAvg (sent, averaged), and the top K_P "personalization
layers", which each client trains along with the base but never sends.

What the paper says: base + personalization layers trained jointly by local SGD each round; only the
base is aggregated (FedAvg); experiments vary K_P (1 to 4 personalization layers on CIFAR with
MobileNet/ResNet-34; FLICKR-AES with 1-2) — fewer personalization layers generalize better on
small data, more personalize more.

Chosen here: `personal_layers` default 1 — the classifier alone is personal, the most common FedPer
configuration in later comparisons (e.g. FedRep, FedBABU, pFedLA's baselines) and the one that keeps
the smallest part out of the federation for a 5-layer CNN/3-layer MLP; search space {1, 2, 3}.
A "layer" is a parameterized module in the order of `fed.model.param_names` (conv, linear), with a
BatchNorm layer counted with the layer before it (see `ClientModel.layers`); its running statistics go
with it. Evaluation uses the global base with each client's own head, with no extra fine-tuning.
"""

from __future__ import annotations

from pydantic import Field

from pflbench.algorithm import ALGORITHMS, Card, Hyperparams
from pflbench.fedavg import FedAvg


class FedPerHP(Hyperparams):
    personal_layers: int = Field(1, ge=0)


@ALGORITHMS.register(
    "fedper",
    card=Card(
        display_name="FedPer",
        family="personal layers",
        paper="Arivazhagan, Aggarwal, Singh & Choudhary, arXiv 2019",
        personalizes="the top layers (personalization layers, default the classifier); the base is FedAvg",
    ),
)
class FedPer(FedAvg[FedPerHP]):
    state_rebuilt = ("_personal",)  # the personalization layers' tensors, from the hyperparameters

    search_space = {"personal_layers": ("choice", [1, 2, 3])}

    def setup(self) -> None:
        super().setup()
        _, self._personal = self.engine.model.split_layers(self.hp.personal_layers)

    def is_local(self, name: str) -> bool:
        return name in self._personal
