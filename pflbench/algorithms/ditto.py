"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): FedAvg for the global model plus one personal model
per client, regularized toward the global model.

What the paper says (Algorithm 1): each selected client k receives the global model w^t and
(i) updates a copy of it on its own loss F_k for E local iterations and sends the result back
(the server averages: plain FedAvg, so the global model is exactly FedAvg's); (ii) updates its
personal model v_k for s local iterations of SGD on F_k(v_k) + lambda/2 * ||v_k - w^t||^2, where
w^t is the global model it *downloaded* this round (not the one it is training). v_k never leaves
the client; the personalized model evaluated is v_k. lambda is tuned per dataset in the paper
(from a small grid between 0.01 and 2; 0.1 and 1 are typical picks), lambda = 0 is pure local
training of v_k and lambda -> infinity pins v_k to the global model.

Where the paper is silent / what was chosen here:
- Personal steps per round: the paper counts "local iterations" for both models without fixing a
  ratio. Here the personal model trains `personal_epochs` epochs (default: None = the cell's
  `local_epochs`, i.e. as much as the global model), so a round costs twice FedAvg's compute.
- Batch order: the global copy trains with the engine's default batch order (stream "batches", the same as
  FedAvg, so Ditto's global model is bit-identical to FedAvg's under the same seed); the personal
  model draws its own order (stream `PERSONAL_STREAM`). With lambda = 0 the personal model is therefore
  exactly `local` training run with that stream (the tests check this bit for bit).
- The proximal term covers the parameters only; BatchNorm statistics of v_k follow its own data.
- Every personal model starts from the cell's common initial model; clients that are not sampled
  keep their personal model unchanged.
- Default lambda = 1: the official code's Fashion-MNIST runs (litian96/ditto,
  `run_fashion_clean_ditto_lam1.sh` and `run_fashion_a1_50_ditto_lam1.sh`: `--lam=1`; also the vehicle
  scripts), FedRep's re-implementation (lgcollins/FedRep `utils/options.py` line 48: `--lam_ditto`
  default 1) and FL-bench (`src/server/ditto.py`: `--lamda` default 1) all use 1 (the measurement
  against this module's earlier 0.1: docs/algorithms/ditto.md). Search space log-uniform [1e-3, 10].
- Communication: exactly FedAvg's (the global model down and up); the personal model is never sent.
"""

from __future__ import annotations


from pydantic import Field

from pflbench import streams
from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams
from pflbench.api_types import proximal
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State


class DittoHP(Hyperparams):
    lam: float = Field(1.0, ge=0.0)  # lambda of the proximal term, >= 0 (official fmnist scripts: 1)
    personal_epochs: int | None = Field(None, ge=1)  # None: the cell's local_epochs


@ALGORITHMS.register(
    "ditto",
    card=Card(
        display_name="Ditto",
        family="regularized and meta-learned",
        paper="Li, Hu, Beirami & Smith, ICML 2021",
        personalizes="a whole personal model per client, trained with a proximal pull toward the FedAvg global model",
    ),
)
class Ditto(FedAvg[DittoHP]):
    state = (*FedAvg.state, "personal_state")  # checkpoints: and every client's personal model
    # Batch-order stream of the personal model's local training (the global copy: "batches", as FedAvg).
    PERSONAL_STREAM = streams.salted_batches("ditto.personal", 0xD1770)

    search_space = {"lam": ("loguniform", 1e-3, 10.0), "personal_epochs": ("int", 1, 5)}

    def setup(self) -> None:
        super().setup()
        # Every client's personal model v_k [N, ...]; never sent.
        self.personal_state = self.engine.init_state(self.engine.num_clients)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        clients = rnd.clients
        # The personal objective: cross-entropy + lam/2 * ||v - w^t||^2, w^t the downloaded global model.
        anchor, objective = proximal(state, self.engine.model.param_names, self.hp.lam)
        global_update = self.engine.train(rnd, clients, state).state
        personal = {n: t[clients] for n, t in self.personal_state.items()}
        personal = self.engine.train(
            rnd,
            clients,
            personal,
            objective=objective,
            aux=anchor,
            epochs=self.hp.personal_epochs,
            stream=self.PERSONAL_STREAM,
        ).state
        for n, t in personal.items():
            self.personal_state[n][clients] = t
        return global_update

    def personalized(self) -> State:
        return self.personal_state
