"""pFedLA and HeurpFedLA (Ma, Zhang, Guo, Xu; CVPR 2022): layer-wise personalized aggregation
learned by one hypernetwork per client on the server.

What the paper says (Section 3, Algorithms 1-2):
- The server keeps every client's latest parameters theta_j and, per client i, an embedding v_i and
  a hypernetwork HN_i(v_i; psi_i) of "several fully connected layers" whose output alpha_i holds one
  weight per (layer, source client), each layer's weights summing to 1 (Eq. 3).
- Client i receives the layer-wise aggregate theta_bar_i^l = sum_j alpha_i^{l,j} theta_j^l
  (Eq. 5-6), trains it for some local epochs and returns delta_i = theta_i - theta_bar_i.
- The server sets theta_i = theta_bar_i + delta_i and updates v_i and psi_i through the chain rule
  (Eq. 10-11): Delta psi_i = (d theta_bar_i / d psi_i)^T delta_i. Sign: local SGD moves along
  -grad L_i, so delta_i ~ -eta * grad L_i and the rule descends L_i (as pFedHN's official code does;
  the public pFedLA reconstructions ascend it: `hn_sign`). Here it is the gradient of
  <theta_bar_i, -delta_i>, exact (a test checks it against finite differences).
- Not given (the supplement with the hypernetwork's structure is not public): the heads'
  initialization, the optimizer and its step.
- HeurpFedLA: each round client i keeps the k layers with the largest self-weight alpha_i^{l,i}
  (k = 1 in Tables 1-2; Eq. 12) and is not sent them (Algorithm 2); it returns Delta theta_i of every
  layer, so the saving is download-only (Section 3.3).

What was chosen (the measurements behind each: docs/algorithms/pfedla.md):
- Structure, as the public reconstructions have it: embedding (dim 100) -> 3 x [Linear(100), ReLU]
  -> one head per layer Linear(100 -> N), a head activation (`head`, default ReLU), normalization per
  layer; a layer whose outputs are all zero falls back to the client's own parameters.
- Heads start at zero weights and bias 1 (`head_init="uniform"`): alpha starts at exactly 1/N
  (FedAvg over the server copies); the reconstructions' U(0, 1) heads (`head_init="random"`) leave
  alpha at uniform averaging.
- Adam per client on the hypernetwork and embedding (`hn_optimizer="adam"`, `hn_lr` 1e-2; each client
  has its own moments and steps only when it trains): the chain-rule gradient's scale varies by orders
  of magnitude, which no fixed SGD rate fits. `hn_optimizer="sgd"` is plain SGD at `hn_lr`.
- The signal is taken relative to one server copy (theta_j - theta_0 in the contraction): this leaves
  the gradient unchanged (each layer's alphas sum to 1) but gives exactly zero for identical copies
  instead of rounding noise that Adam would blow up; a client with a zero gradient does not step.
- ReLU heads can reach exactly 0 and then get no gradient again; `head="softmax"` / `"softplus"`
  cannot in exact arithmetic but do in float32 once Adam has driven the logits apart. On validation
  the three do not differ (docs/algorithms/pfedla.md), so the default stays `relu`. `hn_sign="ascend"`:
  the reconstructions' step sign, for comparison only.
- Weights that stay alive (`logit_bound`, off by default): every Adam run drives the heads' outputs apart
  until alpha is one-hot in float32 (docs/algorithms/pfedla.md); b * tanh(z / b) on the logits keeps every
  softmax or softplus weight strictly between 0 and 1. `alpha_rule="shared_classes"` is not pFedLA but a
  fixed reference row for what layer-wise weights could gain: self-weight 1/2, the other half over the
  clients in proportion to the classes they share with the client (the server is told every client's
  classes: an oracle), no hypernetwork step.
- The fixed family (`alpha_rule="fixed"`, not pFedLA either): references for what fixed layer-wise
  weights reach, chosen on validation as an upper bound to compare any learned alpha with. Every layer
  puts `self_weight` on the client itself and spreads the rest over the other clients by `spread`:
  `uniform`; `shared_classes`, in proportion to the labels two clients' train splits have in common,
  sum_c min(p_i(c), p_j(c)) (each shared class counted by the smaller of the two shares: on splits where
  every client holds every class, such as `dominant`, it still follows which classes dominate, where the
  `shared_classes` rule's count of classes held is uniform; an oracle like that rule); or
  `validation_similarity`, in proportion to exp(-loss) of client j's warmed-up model on client i's
  validation split (the geometric mean of the probability it gives the right labels; our choice: no
  paper fixes one), each client's warm-up being one round's local epochs from the initial model on its
  own train split (batch order: `SIMILARITY_STREAM`). It reads the train and validation splits only, never
  the test split; a cell without a validation split is refused before it runs. Where no other client
  has any affinity (no shared label), the client keeps all of its weight.
- What a "layer" is: `layer="block"` (default) uses the engine's layer groups (a conv or linear
  module with the BatchNorm after it); `layer="tensor"` gives every parameter tensor its own weights.
- BatchNorm statistics are never aggregated: they stay on the client.
- The personalized model of client i is theta_bar_i from the current hypernetwork (the model the
  server would send it now). A client never sampled, and a newcomer, gets the uniform mean of all
  server copies; a newcomer's BatchNorm statistics are fitted on its own train split
  (pflbench.newcomers.batchnorm).
- HeurpFedLA: ties in the self-weights go to the later layers (the classifier first); the server adds
  Delta theta to what the client started from (its copy of a retained layer), and retained layers
  give the hypernetwork no signal this round.
- Everything is batched across clients: hypernetwork rows, the aggregation (one contraction per
  tensor) and the update.

Artifacts: `alpha` [N, L, N] (client i's weights over source clients j for layer l) and
`alpha_layers` (the L layer names), every evaluation round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pflbench import streams
from pflbench.algorithm import ALGORITHMS, Algorithm, Capabilities, Card, ClientRound, Hyperparams, Payload, Round
from pflbench.algorithm import Refusal, Serving
from pflbench.newcomers.batchnorm import fit_batchnorm_statistics
from pflbench.simulator.training import State

if TYPE_CHECKING:
    from pflbench.config import CellConfig

# The hypernetwork's initialization, with the seed it had before streams had names.
HYPERNET_STREAM = streams.Stream("pfedla.hypernet", lambda s, r, c: s * 7919 + 17, "torch")

# The `validation_similarity` warm-up's batch order (round 0: before the first round).
SIMILARITY_STREAM = streams.Stream("batches.pfedla-similarity")

RETAINED = "retained"  # the download's header: [K, L] bool, the layers each client keeps (not sent)


class PFedLAHP(Hyperparams):
    hn_lr: float = Field(1e-2, gt=0)  # hypernetwork and embedding learning rate (Adam)
    hn_optimizer: Literal["adam", "sgd"] = "adam"
    head_init: Literal["uniform", "random"] = "uniform"  # uniform: alpha starts exactly 1/N
    # How a head's outputs become one layer's weights (each summing to 1): relu then normalise (the
    # reconstructions'; a weight at exactly 0 gets no gradient again), softmax, or softplus then
    # normalise (neither reaches exactly 0)
    head: Literal["relu", "softmax", "softplus"] = "relu"
    # Logits squashed into (-b, b) by b * tanh(z / b) before the head (0: unbounded). With softmax or
    # softplus heads no weight can then reach exactly 0 or 1 (softmax: each weight stays within
    # e^(-2b) of every other's scale), however far Adam drives the raw outputs
    logit_bound: float = Field(0.0, ge=0)
    # learned: the hypernetworks (the paper); shared_classes: a fixed reference, not pFedLA: self-weight
    # 1/2 in every layer, the other half over the other clients in proportion to the number of classes
    # each shares with the client (an oracle: the server is told every client's classes), no server step
    # fixed: the fixed family (module doc; not pFedLA): `self_weight` on the client itself in every layer,
    # the rest over the other clients by `spread`, no server step
    alpha_rule: Literal["learned", "shared_classes", "fixed"] = "learned"
    self_weight: float = Field(0.5, ge=0.0, le=1.0)  # alpha_rule fixed only
    # alpha_rule fixed only: uniform; shared_classes (the labels two clients' train splits share); or
    # validation_similarity (how well client j's warmed-up model fits client i's validation split)
    spread: Literal["uniform", "shared_classes", "validation_similarity"] = "uniform"
    # descend: the step lowers the client's loss (Eq. 10-11 read as a gradient step; checked by a
    # finite-difference test); ascend: the public reconstructions' sign, for comparison only
    hn_sign: Literal["descend", "ascend"] = "descend"
    embed_dim: int = Field(100, ge=1)
    hidden_dim: int = Field(100, ge=1)
    hidden_layers: int = Field(3, ge=1)  # Linear + ReLU blocks before the heads
    layer: Literal["block", "tensor"] = "block"
    retain_layers: int = Field(0, ge=0)  # k of HeurpFedLA: layers kept local each round


@ALGORITHMS.register(
    "pfedla",
    card=Card(
        display_name="pFedLA",
        family="hypernetworks and layer-wise aggregation",
        row_order=8,
        paper="Ma, Zhang, Guo & Xu, CVPR 2022",
        personalizes="the aggregation: per client and per layer, weights over all clients' models learned by a server hypernetwork",
    ),
)
class PFedLA(Algorithm[PFedLAHP]):
    # Checkpoints: what each client holds, the server's per-client parameters, the hypernetworks with their
    # Adam moments and step counts, the alphas' cache; the layer grouping and the fixed alphas (the
    # `shared_classes` and `fixed` rules: from the clients' data and, for `validation_similarity`, a warm-up
    # drawn from its own stream, so rebuilt the same on resume) are the cell's.
    state = ("client_state", "server_params", "hypernet", "_moments", "_steps", "_alpha_cache")
    state_rebuilt = ("layer_names", "layer_params", "layer_of", "_fixed")
    capabilities = Capabilities(
        refused_knobs={
            "privacy.mode": "central DP hands the server one noised sum of the updates, and pFedLA's "
            "server steps each client's hypernetwork with that client's own update"
        }
    )
    dp_upload = "update"  # the upload is delta theta_i

    search_space = {"hn_lr": ("loguniform", 1e-3, 3e-1), "hidden_layers": ("int", 1, 4)}

    @classmethod
    def cell_refusal(cls, cell: CellConfig) -> Refusal | None:
        """The fixed family's settings only with `alpha_rule: fixed`; `validation_similarity` only with a
        validation split."""
        hp = cls.parse_hyperparams(cell.hp)
        assert isinstance(hp, PFedLAHP)
        if hp.alpha_rule != "fixed" and (hp.self_weight != 0.5 or hp.spread != "uniform"):
            return Refusal(
                ("hp",),
                f"algorithm {cls.name!r}: hp.self_weight and hp.spread set the weights of alpha_rule 'fixed', "
                f"but alpha_rule is {hp.alpha_rule!r}; give hp.alpha_rule: fixed or leave them out",
            )
        if hp.alpha_rule == "fixed" and hp.spread == "validation_similarity" and cell.val_fraction == 0:
            return Refusal(
                ("val_fraction", "hp"),
                f"algorithm {cls.name!r} with hp.spread 'validation_similarity' weighs the other clients on each "
                f"client's validation split, but val_fraction is 0; give val_fraction > 0 (e.g. 0.1) or "
                f"hp.spread uniform or shared_classes",
            )
        return None

    # ---- the hypernetworks: one per client, stacked along the client dimension -------------------
    def setup(self) -> None:
        fed, hp = self.engine, self.hp
        n = fed.num_clients
        self.client_state = fed.init_state(n)  # what each client holds (incl. BN statistics)
        params = fed.model.param_names
        self.server_params = {p: self.client_state[p].clone() for p in params}  # theta_j on the server
        if hp.layer == "block":
            groups = [[p for p in group if p in params] for group in fed.model.layers]
            self.layer_names = [group[0].rpartition(".")[0] or group[0] for group in groups]
        else:
            groups = [[p] for p in params]
            self.layer_names = list(params)
        self.layer_params = [g for g in groups if g]
        self.layer_of = {p: i for i, g in enumerate(self.layer_params) for p in g}
        if hp.retain_layers >= len(self.layer_params):
            raise ValueError(
                f"retain_layers={hp.retain_layers} keeps every one of the model's "
                f"{len(self.layer_params)} layers local; choose fewer"
            )
        gen = fed.generator(HYPERNET_STREAM)

        def linear(fan_in: int, fan_out: int) -> tuple[Tensor, Tensor]:
            bound = 1 / fan_in**0.5  # nn.Linear's default initialization, one draw per client
            w = (torch.rand(n, fan_out, fan_in, generator=gen) * 2 - 1) * bound
            b = (torch.rand(n, fan_out, generator=gen) * 2 - 1) * bound
            return w, b

        dims = [hp.embed_dim] + [hp.hidden_dim] * hp.hidden_layers
        tensors = {"embedding": torch.randn(n, hp.embed_dim, generator=gen)}
        for i in range(hp.hidden_layers):
            tensors[f"mlp{i}.weight"], tensors[f"mlp{i}.bias"] = linear(dims[i], dims[i + 1])
        num_layers = len(self.layer_params)
        if hp.head_init == "uniform":  # every raw output 1: alpha exactly 1/N, the heads free to move
            tensors["heads.weight"] = torch.zeros(n, num_layers, n, hp.hidden_dim)
            tensors["heads.bias"] = torch.ones(n, num_layers, n)
        else:  # the public reconstructions: U(0, 1) weights, zero bias
            tensors["heads.weight"] = torch.rand(n, num_layers, n, hp.hidden_dim, generator=gen)
            tensors["heads.bias"] = torch.zeros(n, num_layers, n)
        self.hypernet = {k: t.to(fed.device).requires_grad_() for k, t in tensors.items()}
        # Adam's moments and step count, per client (a client's hypernetwork steps only when it trains)
        self._moments = {k: (torch.zeros_like(t), torch.zeros_like(t)) for k, t in self.hypernet.items()}
        self._steps = torch.zeros(n, dtype=torch.long, device=fed.device)
        self._alpha_cache: Tensor | None = None
        self._fixed: Tensor | None = None  # the weights of a fixed rule (no hypernetwork step)
        if hp.alpha_rule == "shared_classes":
            self._fixed = self.shared_class_alphas()
        elif hp.alpha_rule == "fixed":
            self._fixed = self.fixed_alphas()

    def shared_class_alphas(self) -> Tensor:
        """[N, L, N] weights of the `shared_classes` reference: 1/2 on the client itself, 1/2 over the others
        in proportion to the classes of its train split that each holds too (all of it on itself where no
        other client shares a class)."""
        fed, n = self.engine, self.engine.num_clients
        labels = [fed.data(fed.sample_ids(c, "train"))[1] for c in range(n)]
        classes = max(int(y.max()) for y in labels if len(y)) + 1
        held = torch.stack([torch.bincount(y, minlength=classes) > 0 for y in labels]).double()  # [N, C]
        shared = (held @ held.T).fill_diagonal_(0)  # [N, N]
        return self.spread_alphas(shared, 0.5)

    # ---- the fixed family (alpha_rule="fixed") ---------------------------------------------------------
    def fixed_alphas(self) -> Tensor:
        """[N, L, N] weights of `alpha_rule="fixed"`: `self_weight` on the client itself in every layer, the
        rest over the other clients in proportion to `spread`'s affinities (all of it on the client itself
        where no other client has any)."""
        n = self.engine.num_clients
        affinity = {
            "uniform": lambda: torch.ones(n, n, dtype=torch.float64),
            "shared_classes": self.label_overlap,
            "validation_similarity": self.validation_similarity,
        }[self.hp.spread]().fill_diagonal_(0)
        return self.spread_alphas(affinity, self.hp.self_weight)

    def spread_alphas(self, affinity: Tensor, self_weight: float) -> Tensor:
        """[N, L, N] weights, the same in every layer: `self_weight` on the client itself and the rest over the
        other clients in proportion to `affinity` ([N, N] float64, zero diagonal); all of it on the client
        itself where no other client has any affinity."""
        n = self.engine.num_clients
        others = affinity.sum(1, keepdim=True)
        share = (1 - self_weight) * (affinity / others.clamp_min(1e-300))
        weights = torch.where(others > 0, share, torch.zeros_like(affinity))
        weights += torch.diag(torch.where(others[:, 0] > 0, self_weight, 1.0).to(weights.dtype))
        dtype = next(iter(self.server_params.values())).dtype
        return weights.to(dtype)[:, None, :].expand(n, len(self.layer_params), n).contiguous().to(self.engine.device)

    def label_overlap(self) -> Tensor:
        """[N, N] sum_c min(p_i(c), p_j(c)): the share of labels clients i and j have in common, from the
        label distributions p of their train splits (the `shared_classes` spread)."""
        fed, n = self.engine, self.engine.num_clients
        labels = [fed.data(fed.sample_ids(c, "train"))[1].cpu() for c in range(n)]
        counts = torch.stack([torch.bincount(y, minlength=fed.num_classes) for y in labels]).double()  # [N, C]
        shares = counts / counts.sum(1, keepdim=True).clamp_min(1)
        return torch.minimum(shares[:, None, :], shares[None, :, :]).sum(-1)

    def validation_similarity(self) -> Tensor:
        """[N, N] exp(-L[i, j]), L[i, j] the mean cross-entropy of client j's warmed-up model on client i's
        validation split (the `validation_similarity` spread). Warm-up: one round's local epochs of every
        client from the initial model on its own train split, its batch order `SIMILARITY_STREAM`."""
        fed, n = self.engine, self.engine.num_clients
        empty = [c for c in range(n) if int(fed.split_sizes("val")[c]) == 0]
        if empty:
            raise ValueError(
                f"hp.spread 'validation_similarity' needs validation samples on every client, and clients "
                f"{empty} have none; give a larger val_fraction or hp.spread uniform or shared_classes"
            )
        everyone = torch.arange(n, device=fed.device)
        warmed = fed.train(0, everyone, fed.init_state(n), stream=SIMILARITY_STREAM).state
        loss = torch.empty(n, n, dtype=torch.float64)
        with torch.no_grad():
            for j in range(n):  # client j's model on every client's validation split
                model = {k: t[j : j + 1].expand(n, *t.shape[1:]).clone() for k, t in warmed.items()}
                loss[:, j] = fed.evaluate(model, "val", everyone)[1].double().cpu()
        return torch.exp(-loss)

    def alphas(self, rows: Tensor) -> Tensor:
        """Aggregation weights of clients `rows`: [K, L, N], non-negative, each (k, l) summing to 1."""
        if self._fixed is not None:
            return self._fixed[rows]
        hn = self.hypernet
        h = hn["embedding"][rows]
        for i in range(self.hp.hidden_layers):
            h = F.relu(torch.einsum("kd,kod->ko", h, hn[f"mlp{i}.weight"][rows]) + hn[f"mlp{i}.bias"][rows])
        logits = torch.einsum("kd,kljd->klj", h, hn["heads.weight"][rows]) + hn["heads.bias"][rows]
        if self.hp.logit_bound:
            logits = self.hp.logit_bound * torch.tanh(logits / self.hp.logit_bound)
        if self.hp.head == "softmax":
            return torch.softmax(logits, dim=-1)
        raw = F.softplus(logits) if self.hp.head == "softplus" else F.relu(logits)
        total = raw.sum(-1, keepdim=True)
        own = F.one_hot(rows, self.engine.num_clients).to(raw.dtype)[:, None, :].expand_as(raw)
        return torch.where(total > 0, raw / total.clamp_min(1e-12), own)

    def aggregate_params(self, alpha: Tensor, names: list[str] | None = None) -> dict[str, Tensor]:
        """theta_bar[k] per parameter tensor: sum_j alpha[k, layer, j] * theta_j (Eq. 6)."""
        names = self.engine.model.param_names if names is None else names
        return {p: torch.einsum("kj,j...->k...", alpha[:, self.layer_of[p]], self.server_params[p]) for p in names}

    def retained(self, alpha: Tensor, rows: Tensor) -> Tensor:
        """[K, L] bool: the k layers with the largest self-weight (HeurpFedLA), per client; ties (the
        uniform start) go to the later layers, the classifier first."""
        keep = torch.zeros(alpha.shape[:2], dtype=torch.bool, device=alpha.device)
        if self.hp.retain_layers:
            self_weight = alpha[torch.arange(len(rows)), :, rows]  # [K, L]
            last_first = torch.argsort(self_weight.flip(1), dim=1, descending=True, stable=True)
            top = self_weight.shape[1] - 1 - last_first[:, : self.hp.retain_layers]
            keep.scatter_(1, top, True)
        return keep

    # ---- the round -------------------------------------------------------------------------------
    def configure(self, rnd: Round) -> Payload:
        """Each client's aggregated model theta_bar (Eq. 6) from its alpha; with HeurpFedLA's retained
        layers, one dict per client without its own (the header says which: `RETAINED`)."""
        with torch.no_grad():
            alpha = self.alphas(rnd.clients)
            keep = self.retained(alpha, rnd.clients)  # [K, L]
            theta_bar = self.aggregate_params(alpha)
        if not self.hp.retain_layers:
            return Payload.from_state(dict(theta_bar), rnd.clients, header={RETAINED: keep})
        return Payload.from_rows(
            [{p: t[k] for p, t in theta_bar.items() if not keep[k, self.layer_of[p]]} for k in range(len(keep))],
            rnd.clients,
            header={RETAINED: keep},
        )

    def _started(self, rnd: Round, download: Payload) -> dict[str, Tensor]:
        """Each client's parameters at the start of its training: the download, and its own where it
        retained a layer (read before `send` stores the trained ones)."""
        params = self.engine.model.param_names
        if download.is_stacked:
            sent = download.state
            return {p: sent[p] for p in params}
        rows = download.rows
        return {
            p: torch.stack([row.get(p, mine) for row, mine in zip(rows, self.client_state[p][rnd.clients])])
            for p in params
        }

    def receive(self, rnd: ClientRound, download: Payload) -> State:
        state = {name: own[rnd.clients] for name, own in self.client_state.items()}  # buffers: the client's own
        state.update(self._started(rnd, download))
        return state

    def send(self, rnd: ClientRound, state: State) -> Payload:
        start = self._started(rnd, rnd.download)
        for name, t in state.items():
            self.client_state[name][rnd.clients] = t
        # Delta theta_i of every layer, retained ones included (Algorithm 2, line 16): the same upload as
        # pFedLA's; HeurpFedLA saves only on the download.
        return Payload.from_state({p: state[p] - start[p] for p in self.engine.model.param_names}, rnd.clients)

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        """The hypernetworks of the arrived clients step on their deltas (chain rule through theta_bar);
        the server's copy of each arrived client becomes what it started from plus its delta."""
        clients, delta = upload.clients, upload.state
        download = rnd.download
        keep = download.header[RETAINED][upload.positions]
        signal: State = {}
        for p in self.engine.model.param_names:
            # -delta is the descent signal for theta_bar (Eq. 10-11). A retained layer did not come from
            # alpha this round (the client trained its own copy), so it gives the hypernetwork none.
            aggregated = (~keep[:, self.layer_of[p]]).to(delta[p].dtype).view(-1, *[1] * (delta[p].dim() - 1))
            signal[p] = (1 if self.hp.hn_sign == "ascend" else -1) * delta[p] * aggregated
        grads = None if self._fixed is not None else self.hypernetwork_grads(clients, signal)
        with torch.no_grad():
            if grads is not None:
                self.hypernetwork_step(clients, grads)
            sent = self._sent(download, upload.positions)
            for p in self.engine.model.param_names:  # theta_i = (what client i started from) + delta_i
                own = keep[:, self.layer_of[p]].view(-1, *[1] * (delta[p].dim() - 1))
                start = torch.where(own, self.server_params[p][clients], sent[p])
                self.server_params[p][clients] = start + delta[p]
        self._alpha_cache = None

    def _sent(self, download: Payload, positions: Tensor) -> dict[str, Tensor]:
        """theta_bar of the clients at `positions`, as downloaded (rows of a retained layer: the
        server's copy, which `aggregate` takes there instead)."""
        if download.is_stacked:
            sent = download.state
            return sent if len(positions) == len(download) else {p: t[positions] for p, t in sent.items()}
        rows = [download.row(k) for k in positions.tolist()]
        clients = download.clients[positions]
        return {
            p: torch.stack([row.get(p, mine) for row, mine in zip(rows, self.server_params[p][clients])])
            for p in self.engine.model.param_names
        }

    def hypernetwork_step(self, clients: Tensor, grads: dict[str, Tensor]) -> None:
        """One step of each client's hypernetwork on its gradient (Adam per client, or plain SGD).
        A client whose gradient is exactly zero (every server copy the same: round 1) does not step."""
        lr = self.hp.hn_lr
        if self.hp.hn_optimizer == "sgd":
            for key, g in grads.items():
                self.hypernet[key][clients] -= lr * g[clients]
            return
        moving = torch.stack([g[clients].flatten(1).abs().amax(1) for g in grads.values()]).amax(0) > 0
        rows = clients[moving]
        if not len(rows):
            return
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        self._steps[rows] += 1
        t = self._steps[rows].to(next(iter(grads.values())).dtype)
        for key, g in grads.items():
            m, v = self._moments[key]
            g = g[rows]
            m[rows] = beta1 * m[rows] + (1 - beta1) * g
            v[rows] = beta2 * v[rows] + (1 - beta2) * g * g
            shape = (-1,) + (1,) * (g.dim() - 1)
            m_hat = m[rows] / (1 - beta1**t).view(shape)
            v_hat = v[rows] / (1 - beta2**t).view(shape)
            self.hypernet[key][rows] -= lr * m_hat / (v_hat.sqrt() + eps)

    def hypernetwork_grads(self, clients: Tensor, grad_theta: dict[str, Tensor]) -> dict[str, Tensor]:
        """Gradient of sum_k <theta_bar_k, grad_theta_k> w.r.t. the hypernetworks (all rows; only the
        clients' rows are non-zero). theta_bar is linear in alpha, so d/d alpha[k, l, j] is
        sum over layer l's tensors of <theta_j, grad_theta_k> (taken with theta_j - theta_0, which
        leaves the gradient unchanged): one contraction per tensor."""
        num_layers = len(self.layer_params)
        dtype = next(iter(self.server_params.values())).dtype
        g_alpha = torch.zeros(len(clients), num_layers, self.engine.num_clients, dtype=dtype, device=self.engine.device)
        for p, g in grad_theta.items():
            # Relative to one copy: each layer's alphas sum to 1, so subtracting a copy shifts every
            # d/d alpha[k, l, :] by the same amount and leaves the gradient unchanged, while identical
            # copies (round 1) give exactly zero instead of rounding noise that Adam would amplify.
            copies = self.server_params[p]
            g_alpha[:, self.layer_of[p]] += torch.einsum("k...,j...->kj", g, copies - copies[:1])
        alpha = self.alphas(clients)
        keys = list(self.hypernet)
        grads = torch.autograd.grad(alpha, [self.hypernet[k] for k in keys], grad_outputs=g_alpha, allow_unused=True)
        return {k: (torch.zeros_like(self.hypernet[k]) if g is None else g) for k, g in zip(keys, grads)}

    # ---- evaluation and artifacts ----------------------------------------------------------------
    def all_alphas(self) -> Tensor:
        if self._alpha_cache is None:
            with torch.no_grad():
                self._alpha_cache = self.alphas(torch.arange(self.engine.num_clients, device=self.engine.device))
        return self._alpha_cache

    def personalized(self) -> State:
        everyone = torch.arange(self.engine.num_clients, device=self.engine.device)
        with torch.no_grad():
            alpha = self.all_alphas()
            theta = self.aggregate_params(alpha)
            keep = self.retained(alpha, everyone)
            for p in theta:  # HeurpFedLA: retained layers are the client's own
                own = keep[:, self.layer_of[p]]
                if own.any():
                    theta[p][own] = self.client_state[p][own]
        return {name: theta.get(name, self.client_state[name]) for name in self.engine.model.names}

    def newcomer_models(self, serving: Serving) -> State:
        """A newcomer has no hypernetwork of its own (pFedLA keeps one per client and the paper does
        not serve new clients): it gets the uniform aggregate, alpha = 1/N for every layer, which
        is where every client's aggregation weights start (the default `head_init`). BatchNorm
        statistics never leave the clients, so the server has none to give: the newcomer's are
        estimated on its own train split (`fit_batchnorm_statistics`)."""
        newcomers = serving.clients
        count = newcomers.num_clients
        with torch.no_grad():
            uniform = {p: t.mean(0, keepdim=True) for p, t in self.server_params.items()}  # the server's theta_j
        models = newcomers.init_state(count)  # buffers: the initial model's, re-estimated below
        models.update({p: t.expand(count, *t.shape[1:]).clone() for p, t in uniform.items()})
        return fit_batchnorm_statistics(newcomers, models)

    def artifacts(self) -> dict[str, np.ndarray]:
        return {"alpha": self.all_alphas().cpu().numpy().astype(np.float32), "alpha_layers": np.array(self.layer_names)}


class HeurPFedLAHP(PFedLAHP):
    retain_layers: int = Field(1, ge=1)


@ALGORITHMS.register(
    "heurpfedla",
    card=Card(
        display_name="HeurpFedLA",
        family="hypernetworks and layer-wise aggregation",
        row_order=9,
        paper="Ma, Zhang, Guo & Xu, CVPR 2022",
        personalizes="as pFedLA, and each client keeps its k most self-weighted layers without downloading them",
        reduces_to={"pfedla": ("HeurpFedLA equals pFedLA when no layer is retained")},
    ),
)
class HeurPFedLA(PFedLA):
    """HeurpFedLA: pFedLA whose clients keep their k most self-weighted layers (k = 1 in Tables 1-2)."""

    Hyperparams = HeurPFedLAHP
    hp: HeurPFedLAHP

    search_space = {**PFedLA.search_space, "retain_layers": ("int", 1, 2)}
