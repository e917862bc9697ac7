"""FedPAC (Xu, Tong & Huang, ICLR 2023, "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration").

What the paper says: the model is a shared feature extractor (the body) and a personal linear classifier
(the head). A sampled client (1) reports statistics of its features under the model it received, the
class-weighted means h_i = [p_i(k) mu_ik]_k and a variance term v_i; (2) trains its head for one epoch
with the body fixed; (3) trains the body for E epochs on the cross-entropy plus lambda times the squared
distance of each sample's feature to its class's global prototype (feature alignment); (4) uploads the
model and its class prototypes (mean features per class). The server averages the bodies, averages the
prototypes per class (weighted by class counts), and gives each client a combination of the uploaded
heads, sum_j alpha_ij W_j, with alpha_i solving the quadratic program
    min_alpha  alpha^T (diag(v) + D_i) alpha   s.t. alpha >= 0, sum alpha = 1,
    D_i[j, j'] = sum_k (h_ik - h_jk) . (h_ik - h_j'k)        (classifier collaboration).

Checked against the official code (github.com/JianXu95/FedPAC, commit 5770f4f: methods/fedpac.py
LocalUpdate_FedPAC, running.py train_round_fedpac, tools.py protos_aggregation / get_head_agg_weight /
agg_classifier_weighted_p; the lines run on the same tensors: tests/test_fedpac.py). Defaults are its
options.py's: lambda 1.0 (`--lam`), one head epoch (`epoch_classifier = 1`), classifier collaboration on
(`--agg_g 1`); the statistics as its `statistics_extraction` computes them (v_i = sum_k [p_k tr(F_k^T F_k)
/ n_k - p_k^2 |mu_k|^2] / n_i); weights alpha <= 1e-3 zeroed and the rest renormalized; a matrix with a
negative eigenvalue replaced by its part of eigenvalues >= 0.01 (tools.py:121-129).

Departures, each for a reason:
- Both phases use the cell's optimizer (lr, momentum, weight decay), as every method of a table does; the
  official code fixes SGD with momentum 0.5 and weight decay 5e-4, the head at lr 0.1 and the body at
  `--lr` (0.01).
- Training runs in training mode. The official `local_training` sets `model.train()` (fedpac.py:165) and
  then calls `local_test` (:173), which sets `model.eval()` (:69) and nothing sets it back, so its
  BatchNorm and dropout layers train in evaluation mode; its CNNs have neither. Statistics and prototypes use evaluation mode, as there.
- The feature alignment's target for a class no client reported yet is the client's own prototype
  before training, as in the official code; at the first round (no global prototype) there is no
  alignment term (official: `round > 0`).
- The quadratic program is solved with SciPy's SLSQP (the official code uses cvxpy); the eigenvalue test
  and repair are computed in float64 with numpy (official: torch.eig in float32), so they agree where the
  matrix is clearly positive semi-definite (tested) and may differ at rounding level where it is not.
- The server's combined heads reach the clients at the end of the round, as in the official code; the
  engine counts the hooks' payloads, so these C(d+1) values per sampled client are not in bytes_down.
- BatchNorm statistics of the body are averaged with it (the official code averages `state_dict()`:
  the same).
- Newcomers: the global body with a head fitted on the newcomer's train split (FedAvg's local part).
- Privacy knob refused: the uploads carry feature statistics and prototypes the update clipping does
  not cover.
- Not batched for the statistics (a loop over the sampled clients' train splits, forward only); both
  training phases are batched `engine.train` calls.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from pflbench.algorithm import ALGORITHMS, Capabilities, Card, ClientRound, Hyperparams, Payload, Round
from pflbench.fedavg import FedAvg
from pflbench.kit.representation import Split
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import State

HEAD_STREAM = "batches.fedpac-head"  # the head epoch's batch order (a stream of its own)
STATS = ("fedpac.v", "fedpac.h", "fedpac.protos", "fedpac.counts")  # what a client uploads beside its model


class FedPACHP(Hyperparams):
    lam: float = Field(1.0, ge=0.0)  # the feature alignment's weight (official --lam 1.0)
    head_epochs: int = Field(1, ge=0)  # the head's epochs before the body's (official epoch_classifier = 1)
    collaborate: bool = True  # classifier collaboration (official --agg_g 1); False: every head its own
    zero_below: float = Field(1e-3, ge=0.0)  # combination weights at or below it are dropped (official eps)
    eigen_floor: float = Field(0.01, ge=0.0)  # a non-PSD matrix keeps its eigenvalues >= this (official 0.01)


class FeaturesAndLogits(nn.Module):
    """The body and head; the output [B, d + C] is the representation z and the logits h(z)."""

    def __init__(self, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.body, self.head = body, head

    def forward(self, x: Tensor) -> Tensor:
        z = self.body(x)
        return torch.cat([z, self.head(z)], dim=-1)


def aligned_loss(outputs: Tensor, labels: Tensor, state: State, aux: State) -> Tensor:
    """Cross-entropy of the logits plus lam * the mean squared distance of each feature to its class's
    target prototype (aux "targets" [K, C, d], "lam" [K]): FedPAC's body objective, per client [K]."""
    d = aux["targets"].shape[-1]
    features, logits = outputs[..., :d], outputs[..., d:]
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)
    targets = torch.gather(aux["targets"], 1, labels.unsqueeze(-1).expand(*labels.shape, d))
    return ce + aux["lam"] * ((features - targets) ** 2).flatten(1).mean(1)


def head_loss(outputs: Tensor, labels: Tensor, state: State, aux: State) -> Tensor:
    """Cross-entropy of the logits alone (the head's epoch)."""
    logits = outputs[..., outputs.shape[-1] - aux["classes"].shape[-1] :]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape).mean(1)


@ALGORITHMS.register(
    "fedpac",
    card=Card(
        display_name="FedPAC",
        family="personal layers",
        paper="Xu, Tong & Huang, ICLR 2023",
        personalizes="the classifier, a per-client combination of the clients' classifiers chosen by a quadratic "
        "program; the shared features are aligned to global class prototypes",
    ),
)
class FedPAC(FedAvg[FedPACHP]):
    state = (*FedAvg.state, "global_protos", "has_proto")
    state_rebuilt = ("_split", "_net", "_features")
    global_protos: Tensor  # [C, d]: the clients' class prototypes, averaged by class counts
    has_proto: Tensor  # [C] bool: a client has reported the class

    capabilities = Capabilities(
        refused_knobs={
            "privacy": "FedPAC uploads feature statistics and class prototypes beside the model, which the "
            "privacy knob's update clipping does not cover"
        }
    )
    search_space = {"lam": ("loguniform", 0.01, 10.0), "head_epochs": ("int", 0, 3)}

    def setup(self) -> None:
        super().setup()
        self._split = Split.of(self.engine.model)
        self._net: ClientModel = self._split.composite(FeaturesAndLogits)
        self._features: ClientModel = self._split.features_model()
        self.global_protos = torch.zeros(self.engine.num_classes, self._split.features, device=self.engine.device)
        self.has_proto = torch.zeros(self.engine.num_classes, dtype=torch.bool, device=self.engine.device)

    def is_local(self, name: str) -> bool:
        return name in self._split.head_names

    # ---- the round -------------------------------------------------------------------------------
    def configure(self, rnd: Round) -> Payload:
        """The global body and the global prototypes (with which classes have one)."""
        body = super().configure(rnd)
        count = len(rnd.clients)
        protos = {
            "fedpac.global_protos": self.global_protos.expand(count, *self.global_protos.shape),
            "fedpac.has_proto": self.has_proto.expand(count, *self.has_proto.shape),
        }
        return Payload.from_state({**body.state, **protos}, rnd.clients)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        fed, clients, split = self.engine, rnd.clients, self._split
        v, h, protos_before, counts = self.statistics(clients, state)
        model = split.to_composite(state)
        classes = torch.zeros(len(clients), fed.num_classes, device=fed.device)
        if self.hp.head_epochs:
            model = fed.train(
                rnd,
                clients,
                model,
                objective=head_loss,
                model=self._net,
                aux={"classes": classes},
                trainable=[split.composite_name(n) for n in split.head_names if n in fed.model.param_names],
                epochs=self.hp.head_epochs,
                stream=HEAD_STREAM,
            ).state
        sent = rnd.download.state
        has = sent["fedpac.has_proto"]  # [K, C]
        targets = torch.where(has.unsqueeze(-1), sent["fedpac.global_protos"], protos_before)
        lam = torch.full((len(clients),), self.hp.lam, device=fed.device) * has.any(dim=1)
        body = [split.composite_name(n) for n in split.body_names if n in fed.model.param_names]
        model = fed.train(
            rnd,
            clients,
            model,
            objective=aligned_loss,
            model=self._net,
            trainable=body,
            aux={"targets": targets, "lam": lam},
        ).state
        trained = split.from_composite(model)
        _, _, protos_after, _ = self.statistics(clients, trained)
        return {**trained, "fedpac.v": v, "fedpac.h": h, "fedpac.protos": protos_after, "fedpac.counts": counts}

    def statistics(self, clients: Tensor, state: State) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Under each client's model in `state` ([K, ...]), on its whole train split: (v [K], h [K, C, d],
        class prototypes [K, C, d] (zeros for absent classes), class counts [K, C]) as the official
        `statistics_extraction` and `get_local_protos` compute them."""
        fed, d = self.engine, self._split.features
        body = self._split.body_state(state)
        v = torch.zeros(len(clients), device=fed.device)
        h = torch.zeros(len(clients), fed.num_classes, d, device=fed.device)
        protos = torch.zeros_like(h)
        counts = torch.zeros(len(clients), fed.num_classes, device=fed.device)
        with torch.no_grad():
            for k, c in enumerate(clients.tolist()):
                inputs, labels = fed.data(fed.sample_ids(c))
                z = self._features.forward(
                    {n: t[k : k + 1] for n, t in body.items()}, inputs.unsqueeze(0), train=False
                )[0]
                v[k], h[k], protos[k], counts[k] = feature_statistics(z, labels, fed.num_classes)
        return v, h, protos, counts

    def send(self, rnd: ClientRound, state: State) -> Payload:
        """The trained model is the client's; all of it (the head too, for the collaboration) and its
        statistics are uploaded."""
        names = self.engine.model.names
        for n in names:
            self.client_state[n][rnd.clients] = state[n]
        return Payload.from_state(
            {n: state[n] for n in [*self.shared_names(), *self._split.head_names, *STATS]}, rnd.clients
        )

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        sent = upload.state
        self.global_state.update(
            self.weighted_mean(Payload.from_state({n: sent[n] for n in self.shared_names()}, upload.clients))
        )
        counts = sent["fedpac.counts"]  # [J, C]
        total = counts.sum(0)
        weighted = (counts.unsqueeze(-1) * sent["fedpac.protos"]).sum(0)
        present = total > 0
        self.global_protos = torch.where(
            present.unsqueeze(-1), weighted / total.clamp_min(1).unsqueeze(-1), torch.zeros_like(weighted)
        )
        self.has_proto = present
        if not self.hp.collaborate:
            return
        alphas = combination_weights(sent["fedpac.v"], sent["fedpac.h"], self.hp.zero_below, self.hp.eigen_floor)
        for i, client in enumerate(upload.clients.tolist()):
            for n in self._split.head_names:
                if alphas[i] is not None:
                    w = torch.as_tensor(alphas[i], dtype=sent[n].dtype, device=sent[n].device)
                    self.client_state[n][client] = torch.tensordot(w, sent[n], dims=1) / w.sum()
                else:
                    self.client_state[n][client] = sent[n][i]


def feature_statistics(z: Tensor, labels: Tensor, classes: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One client's (v, h [C, d], prototypes [C, d], class counts [C]) from its features z [n, d]."""
    n, d = z.shape
    counts = torch.bincount(labels, minlength=classes).float()
    py = counts / n
    h = torch.zeros(classes, d, device=z.device)
    protos = torch.zeros(classes, d, device=z.device)
    v = torch.zeros((), device=z.device)
    for k in torch.nonzero(counts).flatten().tolist():
        feat_k = z[labels == k]
        mu = feat_k.mean(dim=0)
        protos[k], h[k] = mu, py[k] * mu
        v = v + py[k] * torch.trace(feat_k.T @ feat_k / len(feat_k)) - (py[k] * py[k] * mu * mu).sum()
    return v / n, h, protos, counts


def combination_weights(v: Tensor, h: Tensor, zero_below: float, eigen_floor: float) -> list[np.ndarray | None]:
    """For each uploader i, its weights over the uploaders' heads (None: keep its own), by the official
    `get_head_agg_weight`: the QP over diag(v) + D_i, repaired where not PSD, small weights zeroed."""
    v64, h64 = v.double().cpu().numpy(), h.double().cpu().numpy()  # [J], [J, C, d]
    count = len(v64)
    out: list[np.ndarray | None] = []
    for i in range(count):
        diff = (h64[i][None] - h64).reshape(count, -1)  # [J, C*d]: h_i - h_j
        p = np.diag(v64) + diff @ diff.T
        if not np.all(np.linalg.eigvalsh(p) >= 0.0):
            evals, evecs = np.linalg.eigh(p)
            keep = evals >= eigen_floor
            p = (evecs[:, keep] * evals[keep]) @ evecs[:, keep].T
        if not np.all(np.linalg.eigvalsh(p) >= 0.0):
            out.append(None)
            continue
        alpha = simplex_qp(p)
        alpha = alpha * (alpha > zero_below)
        out.append(alpha if alpha.sum() > 0 else None)
    return out


def simplex_qp(p: np.ndarray) -> np.ndarray:
    """argmin a^T p a over the probability simplex (SLSQP from the uniform point)."""
    from scipy.optimize import minimize  # imported when first used: scipy.optimize alone costs a second a command

    count = len(p)
    result = minimize(
        lambda a: float(a @ p @ a),
        np.full(count, 1.0 / count),
        jac=lambda a: 2 * p @ a,
        method="SLSQP",
        bounds=[(0.0, None)] * count,
        constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones(count)}],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    return np.clip(result.x, 0.0, None)
