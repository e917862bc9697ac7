"""Local training: every client trains only on its own data and never communicates.

Works in model-heterogeneous cells too (nothing is shared, so architectures may differ): there each
group of clients with one architecture keeps its own stacked state and trains batched.
"""
from pflbench.algorithm import ALGORITHMS, Algorithm


@ALGORITHMS.register("local")
class Local(Algorithm):
    name = "local"
    personalizes = "everything: each client trains alone, nothing is shared (the baseline)"
    heterogeneous_models = True

    def is_local(self, name: str) -> bool:
        return True  # nothing is shared: no bytes up or down, nothing to aggregate

    # ---- heterogeneous cells: one stacked state per architecture group ---------------------------
    def setup(self) -> None:
        if not self.fed.heterogeneous:
            return super().setup()
        self.group_state = [self.fed.init_state(len(ids), g) for g, ids in enumerate(self.fed.group_clients)]
        self.row = {}  # client -> row within its group's state
        for ids in self.fed.group_clients:
            self.row.update({c: r for r, c in enumerate(ids.tolist())})

    def configure(self, rnd, clients):
        return {} if self.fed.heterogeneous else super().configure(rnd, clients)

    def receive(self, rnd, clients, download):
        return {} if self.fed.heterogeneous else super().receive(rnd, clients, download)

    def local_train(self, rnd, clients, state):
        if not self.fed.heterogeneous:
            return super().local_train(rnd, clients, state)
        for g, positions in self.fed.by_group(clients):
            members = clients[positions]
            rows = [self.row[c] for c in members.tolist()]
            own = {n: t[rows] for n, t in self.group_state[g].items()}
            for n, t in self.fed.train(rnd, members, own).state.items():
                self.group_state[g][n][rows] = t
        return {}

    def send(self, rnd, clients, state):
        return {} if self.fed.heterogeneous else super().send(rnd, clients, state)

    def personalized(self):
        return self.group_state if self.fed.heterogeneous else super().personalized()
