"""FedCAC: Cautiously Aggressive Collaboration (Wu, Liu, Niu, Zhu & Tang, ICCV 2023, "Bold but Cautious:
Unlocking the Potential of Personalized Federated Learning through Cautiously Aggressive Collaboration").

What the paper says: after local training, each client scores every parameter by its sensitivity,
|(theta_after - theta_before) * theta_after|, and marks the top tau share of each parameter tensor as
critical (its mask M_i); the rest are non-critical. Non-critical parameters collaborate with everyone
(the server's sample-weighted average, the global model). Critical parameters collaborate only with
clients whose critical positions overlap enough: the overlap of clients i and j is
1 - ||M_i - M_j||_1 / (2 ||M_i||_1); client i's collaborators are the j whose overlap reaches
    threshold(r) = mean overlap + (r / beta) * (max overlap - mean overlap)
(means and maxima over the pairs of the round's clients), a threshold that rises round after round
(cautious: ever fewer collaborators), and its customized model is the plain mean of its own and its
collaborators' models. The client's next model, and its personalized model, is
    theta_i = M_i * customized_i + (1 - M_i) * global.

Checked against the authors' code (github.com/kxzxvbk/Fling, commit f6c6f1e7:
fling/component/client/fedcac_client.py `evaluate_critical_parameter`, fling/component/group/fedcac_group.py
`get_customized_global_models`, `sync`, fling/utils/compress_utils/fed_avg.py; PFLlib's port,
clientcac.py and servercac.py, has the same lines): one round's client updates and critical masks, the
global and customized models and the clients' next models agree within float tolerance
(tests/test_official_fedcac.py, fixture tests/fixtures/official/fedcac/).

Hyperparameters: `tau` 0.5 and `beta` 100, the authors' CIFAR-10 configuration
(flzoo/cifar10/cifar10_fedcac_resnet_config.py; their CIFAR-100 one: tau 0.4, beta 170).

Departures and choices, each stated:
- The mask's edge cases are the authors': a tensor whose tau share rounds to no element has no critical
  parameter; where the top-tau threshold is <= 1e-10 the smallest non-zero score is the threshold (and
  where every score is zero, every element is critical).
- BatchNorm running statistics stay on each client, as in the authors' code, whose `sync` writes
  `named_parameters()` only (every statistic a client holds is the one its own training left); its
  server averages them into a global dictionary that no client reads. Here they are never sent. The
  BatchNorm affine parameters are parameters: they follow the masks.
- The server combines theta_i itself (it holds M_i, uploaded with the model as one byte per parameter,
  counted) and sends each sampled client its theta_i: one model down, the model and the mask up. The
  authors' simulation combines on the client; the numbers are the same.
- Clients take part by the cell's schedule: overlaps, threshold and customized models are over the
  round's arrived uploads (the authors' code: every client every round; PFLlib's port: the selected
  clients, as here). A client not yet trained starts from, and is served, the global model; one
  whose upload was lost keeps the mask and customized model of its last arrived upload. With one upload
  in a round its customized model is its own (the authors' threshold divides by zero there).
- Round r of the threshold is the cell's round number (1 in the first round: the authors' epoch + 1).
- Newcomers (unseen clients) get the global model (no mask).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from pflbench.algorithm import ALGORITHMS, Capabilities, Card, ClientRound, Hyperparams, Models, Payload, Round
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State

MASK = "critical."  # the prefix of a mask's name in the upload (one per parameter tensor)


def critical_mask(before: Tensor, after: Tensor, tau: float) -> Tensor:
    """Each client's critical positions in one parameter tensor ([K, ...] bool): the top `tau` share of
    |(after - before) * after|, with the authors' rules for a zero threshold."""
    score = ((after - before) * after).abs()
    masks = []
    for c in score.flatten(1):
        count = int(tau * c.numel())
        thresh = torch.topk(c, count).values[-1] if count > 0 else torch.tensor(float("inf"), device=c.device)
        if thresh <= 1e-10:
            nonzero = c[c > 1e-20]
            if len(nonzero):
                thresh = nonzero.min()
        masks.append(c >= thresh)
    return torch.stack(masks).view(score.shape)


def collaborators(masks: Tensor, round_number: int, beta: float) -> Tensor:
    """[K, K] bool: whom each of K clients (flattened masks [K, P]) collaborates with, itself included."""
    count = len(masks)
    if count < 2:
        return torch.ones(count, count, dtype=torch.bool, device=masks.device)
    m = masks.float()
    distance = torch.cdist(m, m, p=1)  # ||M_i - M_j||_1
    overlap = 1 - distance / (2 * m.sum(1, keepdim=True))
    others = ~torch.eye(count, dtype=torch.bool, device=masks.device)
    mean, top = overlap[others].mean(), overlap[others].max()
    threshold = mean + round_number / beta * (top - mean)
    return (overlap >= threshold) | ~others


class FedCACHP(Hyperparams):
    tau: float = Field(0.5, ge=0.0, le=1.0)  # share of each tensor's parameters that is critical (authors' CIFAR-10)
    beta: int = Field(100, ge=1)  # rounds until only the most overlapping collaborate (authors' CIFAR-10)


@ALGORITHMS.register(
    "fedcac",
    card=Card(
        display_name="FedCAC",
        family="personal layers",
        paper="Wu, Liu, Niu, Zhu & Tang, ICCV 2023",
        personalizes="each client's critical parameters (the most sensitive share of every tensor), averaged only "
        "with clients whose critical positions overlap; the rest is FedAvg",
    ),
)
class FedCAC(FedAvg[FedCACHP]):
    # each client's customized model (parameters) and critical masks [N, ...], and whether it has them
    state = (*FedAvg.state, "customized", "critical", "has_mask")
    capabilities = Capabilities(
        refused_knobs={
            "privacy": "its uploads carry each client's critical-parameter mask, which the privacy knob cannot clip or "
            "noise as a model update"
        }
    )

    search_space = {"tau": ("uniform", 0.1, 0.9), "beta": ("int", 10, 300)}

    def setup(self) -> None:
        super().setup()
        fed = self.engine
        params = fed.model.param_names
        self.customized = {n: self.client_state[n].clone() for n in params}
        self.critical = {n: torch.zeros_like(self.client_state[n], dtype=torch.bool) for n in params}
        self.has_mask = torch.zeros(fed.num_clients, dtype=torch.bool, device=fed.device)

    def is_local(self, name: str) -> bool:
        """BatchNorm's running statistics (the authors' sync writes parameters only)."""
        return name in self.engine.model.buffer_names

    def client_models(self, clients: Tensor) -> State:
        """theta_i = M_i * customized_i + (1 - M_i) * global for `clients`'s shared tensors (the global model
        for a client without a mask)."""
        count = len(clients)
        out = {}
        for n in self.shared_names():
            glob = self.global_state[n].expand(count, *self.global_state[n].shape[1:])
            if n in self.critical:
                mask = self.critical[n][clients] & self.has_mask[clients].view(-1, *([1] * (glob.dim() - 1)))
                out[n] = torch.where(mask, self.customized[n][clients], glob)
            else:
                out[n] = glob
        return out

    def configure(self, rnd: Round) -> Payload:
        return Payload.from_state(self.client_models(rnd.clients), rnd.clients)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        """Local SGD, then the critical masks of the parameters it changed."""
        trained = self.engine.train(rnd, rnd.clients, state).state
        masks = {MASK + n: critical_mask(state[n], trained[n], self.hp.tau) for n in self.engine.model.param_names}
        return {**trained, **masks}

    def send(self, rnd: ClientRound, state: State) -> Payload:
        """The client keeps its model; the model's shared part and its masks (one byte per parameter) go up."""
        model = {n: state[n] for n in self.engine.model.names}
        for n, t in model.items():
            self.client_state[n][rnd.clients] = t
        masks = {n: t.to(torch.uint8) for n, t in state.items() if n.startswith(MASK)}
        return Payload.from_state({**{n: model[n] for n in self.shared_names()}, **masks}, rnd.clients)

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        """The global model (FedAvg), and each arrived client's customized model: the plain mean of its own
        and its collaborators' uploads."""
        sent = upload.state
        models = {n: t for n, t in sent.items() if not n.startswith(MASK)}
        self.global_state.update(self.weighted_mean(Payload.from_state(models, upload.clients)))
        params = [n for n in self.engine.model.param_names if n in models]
        masks = {n: sent[MASK + n].bool() for n in params}
        flat = torch.cat([masks[n].flatten(1) for n in params], dim=1)
        together = collaborators(flat, rnd.number, self.hp.beta).float()
        together = together / together.sum(1, keepdim=True)
        clients = upload.clients
        for n in params:
            self.customized[n][clients] = torch.tensordot(together, models[n], dims=1)
            self.critical[n][clients] = masks[n]
        self.has_mask[clients] = True

    def personalized(self) -> Models:
        """theta_i for every client, with its own BatchNorm statistics."""
        everyone = torch.arange(self.engine.num_clients, device=self.engine.device)
        return {**self.global_with_local(), **self.client_models(everyone)}
