"""FedAS: Federated Parameter-Alignment and Client-Synchronization (Yang, Huang & Ye, CVPR 2024, "FedAS:
Bridging Inconsistency in Personalized Federated Learning").

What the paper says: the model is a shared body and a personal head. Parameter alignment (intra-client
consistency): a client receiving the global body first aligns it with its own knowledge: it computes
the class prototypes of its previous local model (the mean representation of each class on its training
data) and trains the received body so that its representations of each class move toward those
prototypes (the sum over classes of the mean squared error); the aligned body, with the client's own
head, is what it then trains on the cross-entropy. Client synchronization (inter-client consistency):
after training, each client measures how much its model has learned as the trace of the Fisher
information matrix on its data, and the server averages the bodies weighted by these traces (not by data
size), so an under-trained client weighs less. A client's personalized model is its own local model.

Checked against the official code (github.com/xiyuanyang45/FedAS, commit 1a4f5fdb: system/flcore/clients/
clientas.py `train`, `set_parameters`; system/flcore/servers/serveras.py `aggregate_wrt_fisher`): one
round's alignment, training and Fisher traces of two clients and the server's average agree within float
tolerance (tests/test_official_fedas.py, fixture tests/fixtures/official/fedas/).

Hyperparameters, the official code's (the paper gives none of them): the alignment is 1 epoch of plain
SGD at learning rate 0.01 (`align_epochs`, `align_lr`; clientas.py hard-codes both); its batches are the
cell's batch size (the official loader's 16, which is also the local batch size of its one example
command, system/examples.sh). The Fisher trace is sum over one epoch's batches of ||grad of the batch's
mean negative log-likelihood||^2 over every parameter, the model in evaluation mode.

Departures and choices, each stated:
- The official alignment steps the server's global model itself (clientas.py line 212, in `set_parameters`:
  `torch.optim.SGD(model.base.parameters(), lr=0.01)` on the `model` the server passes, stepped at line 227;
  serveras.py line 39 passes `self.global_model` to every selected client in turn): each selected
  client aligns the body the previous one already aligned, so a client's start depends on who came
  before it. Here each client aligns its own copy of the received body (tested: the order of the clients
  changes nothing).
- Prototypes are the class means over all of a client's training samples (the official loader drops
  the last incomplete batch of 16); the alignment and the Fisher trace follow the engine's batch plan
  (its own streams, `ALIGN_STREAM`, `FISHER_STREAM`), where the official loader reads the data in order.
  Both run with the model in evaluation mode, as the official code leaves it (BatchNorm statistics are
  read, not updated).
- The official code also computes the Fisher trace of every client not selected, which the server never
  reads (it weights the uploads by their own clients' latest trace): not done here.
- The server averages the bodies with their BatchNorm statistics (the official averages parameters only,
  serverbase.py lines 154-156, `add_parameters`, and its global statistics are the first upload's); the heads, which
  the official server also averages but no client ever takes, are not sent.
- A client not yet trained is served its initial model (the official code's too); newcomers (unseen
  clients) get the global body with a head fitted on their training data (`FedAvg.newcomer_models`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pflbench.algorithm import ALGORITHMS, Capabilities, Card, ClientRound, Hyperparams, Models, Payload
from pflbench.fedavg import FedAvg
from pflbench.kit.feature_training import Head, forward_with_features, head_of, train_with_features
from pflbench.round_context import Round
from pflbench.kit.steps import step_plan
from pflbench.streams import Stream
from pflbench.simulator.training import SGD, State

FISHER = "fisher"  # the upload's Fisher trace, [K]


class FedASHP(Hyperparams):
    align_epochs: int = Field(1, ge=0)  # the alignment's epochs (official: 1, hard-coded)
    align_lr: float = Field(0.01, gt=0.0)  # its plain SGD's learning rate (official: 0.01, hard-coded)


@ALGORITHMS.register(
    "fedas",
    card=Card(
        display_name="FedAS",
        family="personal layers",
        paper="Yang, Huang & Ye, CVPR 2024",
        personalizes="the head and the whole local model; the received body is first aligned with the client's "
        "own class prototypes, and bodies are averaged by their Fisher information",
    ),
)
class FedAS(FedAvg[FedASHP]):
    state_rebuilt = ("_head", "_head_names")
    capabilities = Capabilities(
        refused_knobs={
            "privacy": "its uploads carry each client's Fisher trace, the aggregation weight, which the privacy knob "
            "cannot privatize as a model update"
        }
    )
    ALIGN_STREAM = Stream("batches.fedas-align")
    FISHER_STREAM = Stream("batches.fedas-fisher")

    search_space = {"align_epochs": ("int", 0, 3), "align_lr": ("loguniform", 1e-3, 1e-1)}

    def setup(self) -> None:
        super().setup()
        self._head: Head = head_of(self.engine.model)
        self._head_names = self.engine.model.split_layers(1)[1]

    def is_local(self, name: str) -> bool:
        return name in self._head_names

    def prototypes(self, clients: Tensor) -> Tensor:
        """[K, C, D]: each client's class means of its own model's representation on its training data
        (zeros for a class it does not hold)."""
        fed = self.engine
        out = torch.zeros(len(clients), fed.num_classes, self._head.dim, device=fed.device)
        with torch.no_grad():
            for k, c in enumerate(clients.tolist()):
                row = {n: self.client_state[n][c : c + 1] for n in fed.model.names}
                sums = torch.zeros(fed.num_classes, self._head.dim, device=fed.device)
                counts = torch.zeros(fed.num_classes, device=fed.device)
                for part in fed.sample_ids(c, "train").split(1024):
                    x, y = fed.data(part.unsqueeze(0))
                    _, features = forward_with_features(fed.model, row, x, train=False, head=self._head)
                    sums.index_add_(0, y[0], features[0])
                    counts.index_add_(0, y[0], torch.ones_like(y[0], dtype=counts.dtype))
                out[k] = sums / counts.clamp(min=1).unsqueeze(1)
        return out

    def align(self, rnd: ClientRound, state: State) -> State:
        """The received body trained toward the client's prototypes: per batch, the sum over its classes
        of the mean squared error of their representations to their prototype."""
        clients = rnd.clients
        body = [n for n in self.engine.model.param_names if n not in self._head_names]

        def objective(
            logits: Tensor, features: Tensor, labels: Tensor, model: State, carry: State
        ) -> tuple[Tensor, State]:
            target = torch.gather(carry["prototypes"], 1, labels.unsqueeze(-1).expand(-1, -1, features.shape[-1]))
            error = ((features - target) ** 2).mean(-1)  # [K, B]
            one_hot = F.one_hot(labels, carry["prototypes"].shape[1]).to(error.dtype)  # [K, B, C]
            per_class = torch.einsum("kb,kbc->kc", error, one_hot) / one_hot.sum(1).clamp(min=1)
            return per_class.sum(1), carry

        aligned, _, _ = train_with_features(
            self.engine,
            rnd,
            clients,
            state,
            objective,
            carry={"prototypes": self.prototypes(clients)},
            trainable=body,
            epochs=self.hp.align_epochs,
            stream=self.ALIGN_STREAM,
            train=False,
            sgd=SGD(self.hp.align_lr),
        )
        return aligned

    def fisher_trace(self, rnd: Round, clients: Tensor, state: State) -> Tensor:
        """[K]: the sum over one epoch's batches of ||grad of the batch's mean NLL||^2 over every parameter,
        the model in evaluation mode."""
        fed = self.engine
        if not fed.batched and len(clients) > 1:
            return torch.cat(
                [
                    self.fisher_trace(rnd, clients[k : k + 1], {n: t[k : k + 1] for n, t in state.items()})
                    for k in range(len(clients))
                ]
            )
        params = fed.model.param_names
        plan = step_plan(fed, rnd, clients, stream=self.FISHER_STREAM, epochs=1)
        total = torch.zeros(len(clients), device=fed.device)
        for step in range(plan.steps):
            active = plan.active(step)
            rows = active.rows
            view = state if rows is None else {n: t[rows] for n, t in state.items()}
            leaves = {n: view[n].detach().requires_grad_(True) for n in params}
            x, y = fed.data(plan.ids[:, step] if rows is None else plan.ids[rows, step])
            logits = fed.model.forward({**view, **leaves}, x, train=False)
            nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
            grads = torch.autograd.grad(nll.sum(), list(leaves.values()))
            squared = torch.stack([g.pow(2).flatten(1).sum(1) for g in grads]).sum(0).detach()
            if rows is None:
                total += squared
            else:
                total.index_add_(0, rows, squared)
        return total

    def local_train(self, rnd: ClientRound, state: State) -> State:
        """Align the received body, train the whole model on the cross-entropy, measure its Fisher trace."""
        aligned = self.align(rnd, state) if self.hp.align_epochs else state
        trained = self.engine.train(rnd, rnd.clients, aligned).state
        return {**trained, FISHER: self.fisher_trace(rnd, rnd.clients, trained)}

    def send(self, rnd: ClientRound, state: State) -> Payload:
        """The client keeps its whole model; the body and the Fisher trace go up."""
        for n in self.engine.model.names:
            self.client_state[n][rnd.clients] = state[n]
        return Payload.from_state({**{n: state[n] for n in self.shared_names()}, FISHER: state[FISHER]}, rnd.clients)

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        """The bodies' mean weighted by their clients' Fisher traces."""
        sent = upload.state
        models = Payload.from_state({n: t for n, t in sent.items() if n != FISHER}, upload.clients)
        self.global_state.update(self.weighted_mean(models, weights=sent[FISHER]))

    def personalized(self) -> Models:
        """Each client's own local model."""
        return self.client_state
