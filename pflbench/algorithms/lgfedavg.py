"""LG-FedAvg (Liang et al., 2020, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations"): the opposite split of FedPer — each client keeps its own *local
representation* layers (the lower part of the network, never sent), and only the top layers, the
*global* head operating on those representations, are averaged by FedAvg.

What the paper says: local and global parts trained jointly on each client by local SGD; only the
global layers are communicated and averaged; local models are evaluated (the paper's "local test"
setting). Its reference runs keep the top 2 layers global for the CIFAR-10 CNN (`--num_layers_keep 2`)
and 3 for the MNIST MLP; it initializes from a FedAvg-pretrained model (`--load_fed`) and keeps
each client's best model over rounds — neither is reproduced here (all methods start from the
cell's shared random init and are scored at the same round, as in every other cell).

Chosen here: `global_layers` default 2 (the paper's CNN setting: fc2 + fc3 of the pFedLA CNN global,
conv1, conv2, fc1 local; for the 3-layer MLP, fc1 local, fc2 + fc3 global); search {1, 2, 3}.
Layers are grouped generically by position (`ClientModel.layers`; BatchNorm goes with
the layer before it, so on `cnn-bn` BatchNorm is local, as in FedBN). Aggregation is weighted by
training samples, like every FedAvg-based method here (the original code averages uniformly).
"""

from pydantic import Field

from pflbench.algorithm import ALGORITHMS, Card, Hyperparams
from pflbench.fedavg import FedAvg


class LGFedAvgHP(Hyperparams):
    global_layers: int = Field(2, ge=0)


@ALGORITHMS.register(
    "lg-fedavg",
    card=Card(
        display_name="LG-FedAvg",
        family="personal layers",
        paper="Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov & Morency, arXiv 2020 (Think Locally, Act Globally)",
        personalizes="the lower layers (local representations); the top layers are FedAvg",
    ),
)
class LGFedAvg(FedAvg[LGFedAvgHP]):
    state_rebuilt = ("_local",)  # the local representation layers' tensors, from the hyperparameters

    search_space = {"global_layers": ("choice", [1, 2, 3])}

    def setup(self) -> None:
        super().setup()
        self._local, _ = self.engine.model.split_layers(self.hp.global_layers)

    def is_local(self, name: str) -> bool:
        return name in self._local
