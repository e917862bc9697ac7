"""FedBN (Li et al., ICLR 2021): FedAvg, except that BatchNorm layers — their affine parameters and
their running statistics — stay on each client and are never sent or averaged. On a model without
BatchNorm (pFedLA's EMNIST/FashionMNIST CNN) it is exactly FedAvg, which is why pFedLA's tables
leave those columns empty.
"""

from pflbench.algorithm import ALGORITHMS, Card
from pflbench.fedavg import FedAvg


@ALGORITHMS.register(
    "fedbn",
    card=Card(
        display_name="FedBN",
        family="personal layers",
        row_order=5,
        paper="Li, Jiang, Zhang, Kamp & Dou, ICLR 2021",
        personalizes="the BatchNorm layers (affine parameters and running statistics); the rest is FedAvg",
        reduces_to={
            "fedavg": (
                "FedBN keeps BatchNorm layers local and averages the rest; this model has no BatchNorm, "
                "so FedBN is FedAvg"
            )
        },
    ),
)
class FedBN(FedAvg):
    def is_local(self, name: str) -> bool:
        return name in self.engine.model.batchnorm_names
