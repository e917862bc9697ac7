"""Centralized training: the reference a single global model is measured against, not an FL method.

Each round the server trains one model on the union of the round's clients' training data, shuffled
together (IID minibatches, no client drift), for the cell's local epochs with the cell's optimizer.
Every client is then evaluated with that one model on its own test split, as FedAvg's global model
is. So it bounds what a global model can reach on the cell's split and budget: where Local beats
`centralized`, no FedAvg-like global model can be expected to beat Local.

It moves raw data, not models, so no model bytes are counted: its communication is not comparable
with the federated methods'.
"""

from pflbench.algorithm import ALGORITHMS, Capabilities, Card, Payload, Round
from pflbench.fedavg import FedAvg


@ALGORITHMS.register(
    "centralized",
    card=Card(
        display_name="Centralized (reference)",
        family="baselines",
        reference=True,
        personalizes="nothing: one model trained on the pooled data of the round's clients (a reference, not FL)",
    ),
)
class Centralized(FedAvg):
    capabilities = Capabilities(
        refused_knobs={
            "system": "the server trains on the pooled data itself: no client does local work or uploads",
            "privacy": "nothing is uploaded: the server trains on the pooled raw data",
        }
    )

    def configure(self, rnd: Round) -> Payload:
        return Payload.empty(rnd.clients)

    def receive(self, rnd: Round, download: Payload) -> dict:
        return {}

    def local_train(self, rnd: Round, state: dict) -> dict:
        self.global_state = self.engine.train_pooled(rnd.number, rnd.clients, self.global_state).state
        return {}

    def send(self, rnd: Round, state: dict) -> Payload:
        return Payload.empty(rnd.clients)

    def aggregate(self, rnd: Round, upload: Payload) -> None:
        pass  # the server trained the model itself
