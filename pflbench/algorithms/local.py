"""Local training: every client trains only on its own data and never communicates.

Works in model-heterogeneous cells too (nothing is shared, so architectures may differ): there each
group of clients with one architecture keeps its own stacked state and trains batched.

Unseen clients (`unseen_fraction`): a newcomer trains from scratch on its own train split, with the
local work a trained client has had on average by then: `local_epochs` times the expected number of
rounds it was sampled in, round(rnd x per_round / trained clients) (0 before a first expected turn:
the initial model, as an unsampled client has). The newcomers' models are kept between evaluations
and trained on by the difference, so the cost over a run is one client's, not a triangle of
retrainings. The top-up is done turn by turn, each turn `local_epochs` epochs with fresh momentum
(as a trained client's round) and the batch orders keyed by the turn's number, so a newcomer's model
at round r is the same whichever rounds were evaluated before (its scores do not depend on
`eval_every`).
"""

from pflbench.algorithm import ALGORITHMS, Capabilities, Card, ClientRound, Models, Payload, Round, Serving
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State


@ALGORITHMS.register(
    "local",
    card=Card(
        display_name="Local",
        family="baselines",
        row_order=0,
        personalizes="everything: each client trains alone, nothing is shared (the baseline)",
    ),
)
class Local(FedAvg):
    capabilities = Capabilities(heterogeneous_models=True)
    # Checkpoints: FedAvg's models, or across architectures one stacked state per group; the newcomers'
    # models and turns, kept between evaluations. `row` is the clients' places in their group's state.
    state = (*FedAvg.state, "group_state", "_newcomer_state", "_newcomer_turns")
    state_rebuilt = ("row",)

    def is_local(self, name: str) -> bool:
        return True  # nothing is shared: no bytes up or down, nothing to aggregate

    # ---- heterogeneous cells: one stacked state per architecture group ---------------------------
    def setup(self) -> None:
        if not self.engine.heterogeneous:
            return super().setup()
        self.group_state = [self.engine.init_state(len(ids), g) for g, ids in enumerate(self.engine.group_clients)]
        self.row: dict[int, int] = {}  # client -> row within its group's state
        for ids in self.engine.group_clients:
            self.row.update({c: r for r, c in enumerate(ids.tolist())})

    def configure(self, rnd: Round) -> Payload:
        return Payload.empty(rnd.clients) if self.engine.heterogeneous else super().configure(rnd)

    def receive(self, rnd: ClientRound, download: Payload) -> State:
        return {} if self.engine.heterogeneous else super().receive(rnd, download)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        if not self.engine.heterogeneous:
            return super().local_train(rnd, state)
        for g, positions in self.engine.by_group(rnd.clients):
            members = rnd.clients[positions]
            rows = [self.row[c] for c in members.tolist()]
            own = {n: t[rows] for n, t in self.group_state[g].items()}
            for n, t in self.engine.train(rnd, members, own).state.items():
                self.group_state[g][n][rows] = t
        return {}

    def send(self, rnd: ClientRound, state: State) -> Payload:
        return Payload.empty(rnd.clients) if self.engine.heterogeneous else super().send(rnd, state)

    def personalized(self) -> Models:
        return self.group_state if self.engine.heterogeneous else super().personalized()

    def newcomer_models(self, serving: Serving) -> Models:
        """Trained from scratch on the newcomers' own data, with the average trained client's epochs."""
        newcomers = serving.clients
        per_round = self.engine.budget.clients_per_round
        turns = round(serving.round * per_round / self.engine.num_clients)  # a trained client's expected turns by now
        if getattr(self, "_newcomer_state", None) is None:
            self._newcomer_state = [newcomers.init_state(len(ids), g) for g, ids in enumerate(newcomers.group_clients)]
            self._newcomer_turns = 0
        for turn in range(self._newcomer_turns + 1, turns + 1):  # keyed by the turn, not the evaluating round
            self._newcomer_state = [
                newcomers.train(turn, ids, state).state if len(ids) else state
                for ids, state in zip(newcomers.group_clients, self._newcomer_state)
            ]
        self._newcomer_turns = max(self._newcomer_turns, turns)
        models = [{n: t.clone() for n, t in state.items()} for state in self._newcomer_state]
        return models if newcomers.heterogeneous else models[0]
