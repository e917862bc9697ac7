"""FedProx (Li et al., MLSys 2020): FedAvg whose local objective adds the proximal term
mu/2 * ||w - w_global||^2, w_global being the model the client downloaded this round.

What the paper says: the proximal term over all model parameters; mu tuned from {0.001, 0.01, 0.1, 1}
(mu = 1 on Synthetic, 0.01 or 0.001 on the image/text sets); FedProx also tolerates partial work
(a variable number of local epochs per client, "stragglers").

Where it was silent / what was chosen here:
- mu default 0.01 (the middle of the paper's grid, the value it reports for several of its real data
  sets); search space loguniform 1e-3..1, the paper's grid as a range.
- The term covers trainable parameters only, not BatchNorm running statistics (they are not weights).
- Every client runs the cell's full `local_epochs` (no simulated stragglers: that is a system-
  heterogeneity experiment, not part of the algorithm's objective).
- mu = 0 uses FedAvg's plain local training, so FedProx(mu=0) is FedAvg bit for bit.
"""

from pydantic import Field

from pflbench.algorithm import ALGORITHMS, Card, ClientRound, Hyperparams
from pflbench.api_types import proximal
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State


class FedProxHP(Hyperparams):
    mu: float = Field(0.01, ge=0.0)


@ALGORITHMS.register(
    "fedprox",
    card=Card(
        display_name="FedProx",
        family="baselines",
        paper="Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, MLSys 2020",
        personalizes="nothing: one global model, trained with a proximal term against client drift",
        reduces_to={"fedavg": ("FedProx's proximal term (mu) changed none of the evaluated numbers: FedAvg")},
    ),
)
class FedProx(FedAvg[FedProxHP]):
    search_space = {"mu": ("loguniform", 1e-3, 1.0)}

    def local_train(self, rnd: ClientRound, state: State) -> State:
        mu = float(self.hp.mu)
        if mu == 0.0:  # exactly FedAvg: no extra term, not even a zero one
            return super().local_train(rnd, state)
        # Cross-entropy + mu/2 * ||w - w_global||^2 over the parameters; the downloaded global model rides
        # along as `aux`, stacked like the state (one row per client).
        anchor, objective = proximal(state, self.engine.model.param_names, mu)
        return self.engine.train(rnd, rnd.clients, state, objective=objective, aux=anchor).state
