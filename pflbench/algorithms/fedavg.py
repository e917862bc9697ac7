"""FedAvg (McMahan et al., 2017): clients train the global model locally; the server averages the
results weighted by each client's number of training samples. Its "personalized" model is the
global one — the baseline every pFL method must beat.

BatchNorm statistics, when the model has them, are averaged like parameters (FedAvg averages the
whole state dict); FedBN is the variant that keeps them local.

The class is `pflbench.fedavg.FedAvg`, also the base that most built-ins extend (FedBN, FedPer, FedProx,
Ditto, ...); it is registered here, under its name, with its card.
"""

from pflbench.algorithm import ALGORITHMS, Card
from pflbench.fedavg import FedAvg

ALGORITHMS.register(
    "fedavg",
    card=Card(
        display_name="FedAvg",
        family="baselines",
        row_order=1,
        paper="McMahan, Moore, Ramage, Hampson & Agüera y Arcas, AISTATS 2017",
        personalizes="nothing: one global model for every client (the baseline)",
    ),
)(FedAvg)

__all__ = ["FedAvg"]
