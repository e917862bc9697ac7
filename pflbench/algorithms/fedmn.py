"""FedMN: personalized FL with heterogeneous modular networks (Wang et al., ICDM 2022, arXiv
2210.14830; official code github.com/xztcwang/FedMN). Spec: `../shared/specs/fedmn.md`; tags:
[C] read in the official code, [P] the paper's abstract/introduction, [INF] ours (the paper's method
section was not available).

Model [C]: L modular layers with M_l independent modules each (default 3 layers x 2 modules):
layer 0 encoders (a LeNet-style conv net for images: conv(32,5)-pool-conv(64,5)-pool-fc(2048)-fc(512);
an MLP for vectors), hidden modules Linear(512, 256)+ReLU+dropout 0.5, output modules Linear(256, C).
The code appends the same module object M times (all modules of a layer share weights); here the
modules are independent copies [INF] (`code_compat` ties them again).

Routing [C]: gates on the edges between modules: M_0 input gates, a M_l x M_{l-1} connection matrix
per layer l >= 1, M_{L-1} output gates. Module k of layer l reads sum_j A[k,j] h_j / sum_j A[k,j];
the logits are sum_k g_k h_k / sum_k g_k. The routing hypernetwork reads the client's whole local
training set (x and one-hot y) as one set: s = mean_i Linear(ReLU(L2norm([phi_x(x_i); phi_y(y_i)])))
(DeepSets mean pooling; phi_x -> 128, phi_y = Linear(C, 64)) [C]; phi_x is a small conv net here
(the code uses the pretrained encoder type) [INF]. It is recomputed at every local step [C]
(`router_samples` > 0 subsamples the set, for speed [INF], from the cell seed's stream
"fedmn.router-samples").

Faithful version [INF, the spec's recommendation]: binary-concrete gates sigmoid((s + logistic noise)/tau),
straight-through hard gates (forward 0/1, gradient of the soft gate) trained end to end with the
modules; tau annealed tau <- max(tau0 exp(-rate t), tau_min) per local step (the code's constants
1.0, 3e-5, 0.5); deterministic gates 1[s > 0] at test time; each layer keeps at least one active path
(the best-scoring gate or edge among active modules is forced on). A module is *active* for a client
when it receives an active input (layer 0: its gate; layer l: sum_j active_{l-1,j} A[k,j] > 0) [C].
Optional sparsity term lambda * mean(soft gates), default 0 [INF; the code has no regularizer].

Protocol [C, with the communication-efficient interaction of P]: every round the server sends each
client the routing net and only the modules of that client's last routing (everything the first time);
the client trains modules and routing net jointly (cell's SGD: the code uses lr 0.02, momentum 0.9,
weight decay 5e-4, batch 128, 1 epoch), fixes its routing deterministically from its data, and sends
back the routing net and its active modules. The server averages each module (unweighted) over the
clients that sent it and keeps the previous value of a module nobody sent (the code sets it to 0); the
routing net is averaged (unweighted) over the round's clients. A client evaluates the aggregated
modules with its own frozen routing. Personalization comes only from routing. A client not trained
yet is evaluated with the routing the current server routing net fixes from its data, made afresh at
each evaluation and never kept [INF]: its first download is every module whatever was evaluated before (evaluation
writes nothing training reads, so `eval_every` changes neither bytes nor training).

Initialization [INF, changed after measuring]: the official code warm-starts the encoder modules
from a FedAvg-pretrained checkpoint (146 rounds) and its soft gates followed by a softmax keep every
module on with nearly equal weight, so it never trains this pool from scratch through hard gates. Here
the pool starts from scratch, and two choices matter (both off in `code_compat`):
- `he_init` (default True): He (fan-in, ReLU) init of every layer followed by a ReLU, zero biases;
  output modules keep PyTorch's default. With PyTorch's default init the 6-layer stack (conv, conv, fc,
  fc, hidden, output; each layer mixing means of modules) starts with logits of std ~0.03 and sits on a
  plateau at loss ln(10) that client averaging does not escape.
- `gate_bias_init` (default 2.0): added to the bias of the router's output layer, so every gate starts
  on (deterministic gates 1[s > 0]: all modules; training: on with probability sigmoid(2) = 0.88 at
  tau = 1), as in the code, and the router learns to switch modules off. With logits near 0 every
  training step draws each gate by a fair coin (tau ~ 1 for the first ~10^4 steps): each step trains a
  random sub-network (whole modules dropped with probability 1/2) and the loss stays high.
(Measured, each choice on and off: docs/algorithms/fedmn.md.)

`code_compat=True` reproduces the official code's behaviour for comparison: the routing is detached
(`.item()`: the routing net never learns), soft 2-way Gumbel-softmax gates at tau = 1 (the annealing
never fires) followed by a softmax over all gates, input gates forced to 1, all modules of a layer
sharing weights, everything sent both ways, and the last training step's gates frozen for testing.
Its wrong division inside the output loop is not reproduced.

Unseen clients [INF]: the routing net is a set function of a client's data, so a newcomer is served
as a client is evaluated: the aggregated pool with the routing the current (server) routing net fixes
from the newcomer's own training data; nothing is trained for it.

Local training is a loop over clients (`batched = False`): every client runs its own routed graph.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from pflbench import streams
from pflbench.algorithm import ALGORITHMS, Algorithm, Capabilities, Card, ClientRound, Hyperparams, Payload
from pflbench.algorithm import Round, Scored, Scores, Serving
from pflbench.kit.steps import step_ids
from pflbench.simulator.training import SGD, Diverged, State

if TYPE_CHECKING:
    from pflbench.engine import Engine

# What a client trains in a round (`receive`'s, `local_train`'s): its copy of the routing net, by client.
RouterStates = list[dict[str, State]]


class PoolAndRouting(TypedDict):
    """FedMN's models for a population (`personalized`, `newcomer_models`): the module pool and each
    client's routing."""

    pool: State  # the aggregated module pool's state
    routing: Tensor  # [N, ...]: each client's frozen routing gates


# Random streams (pflbench.streams), with the derivations they had before streams had names.
INIT_STREAM = streams.Stream("fedmn.init", lambda s, r, c: s, "torch")  # the module pool's and router's initialization
NOISE_STREAM = streams.salted_batches("fedmn.noise", 0xF3D)  # the routing noise, per round and client
# dropout in the local training (torch's global generator), per round and client
DROPOUT_STREAM = streams.Stream("fedmn.dropout", lambda s, r, c: streams.batch_seed(0xF3D, s, r, c) % (2**63), "torch")
# dropout in the evaluation-time adaptation, per round and client
ADAPT_DROPOUT_STREAM = streams.Stream(
    "fedmn.adapt-dropout",
    lambda s, r, c: s * 1_000_003 + streams.need(r, "round") * 1009 + streams.need(c, "client"),
    "torch",
)
# The router's samples once drew from the client alone (the same at every seed); seed 0 keeps those draws.
# torch seeds its CPU generator with the low 32 bits: an odd multiplier keeps seeds apart there.
ROUTER_SAMPLES_STREAM = streams.Stream(
    "fedmn.router-samples", lambda s, r, c: streams.need(c, "client") + s * 0x9E3779B1, "torch"
)


def _sgd_step(sgd: SGD, params: list[Tensor], momenta: list[Tensor] | None) -> None:
    """The engine's SGD rule on the parameters that have a gradient this step; the others (modules
    routed off, a detached router) keep their values and momentum, as torch.optim.SGD leaves
    parameters without a gradient."""
    live = [(i, p.grad) for i, p in enumerate(params) if p.grad is not None]
    sgd.apply(
        [params[i] for i, _ in live],
        [grad for _, grad in live],
        None if momenta is None else [momenta[i] for i, _ in live],
    )


def _encoder(
    input_shape: tuple[int, ...], hidden: int, out: int, channels: tuple[int, int] = (32, 64)
) -> nn.Sequential:
    """LeNet-style conv encoder for images (C, H, W), else an MLP; ends in ReLU(Linear(hidden, out))
    when `hidden`, else Linear(., out)."""
    if len(input_shape) == 3:
        c, h, w = input_shape
        side_h, side_w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        body: list[nn.Module] = [
            nn.Conv2d(c, channels[0], 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels[0], channels[1], 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        ]
        flat = channels[1] * side_h * side_w
    else:
        body, flat = [nn.Flatten()], math.prod(input_shape)
    if hidden:
        return nn.Sequential(*body, nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, out), nn.ReLU())
    return nn.Sequential(*body, nn.Linear(flat, out))


class ModularNet(nn.Module):
    """The module pool: `layers[l][j]` is module j of layer l."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        modules_per_layer: list[int],
        dims: list[int],
        encoder_hidden: int,
        dropout: float,
    ):
        super().__init__()
        if len(dims) != len(modules_per_layer) - 1:
            raise ValueError(f"dims needs one width per layer but the last: {len(modules_per_layer) - 1}, got {dims}")
        layers = [nn.ModuleList(_encoder(input_shape, encoder_hidden, dims[0]) for _ in range(modules_per_layer[0]))]
        for l in range(1, len(modules_per_layer)):
            last = l == len(modules_per_layer) - 1
            layers.append(
                nn.ModuleList(
                    nn.Linear(dims[l - 1], num_classes)
                    if last
                    else nn.Sequential(nn.Linear(dims[l - 1], dims[l]), nn.ReLU(), nn.Dropout(dropout))
                    for _ in range(modules_per_layer[l])
                )
            )
        self.layers = nn.ModuleList(layers)
        self.sizes = list(modules_per_layer)
        # A gate above this is on: hard gates are 0/1 up to the straight-through rounding; the
        # official code's soft gates are all > 0 (FedMN sets 0 in code_compat).
        self.threshold = 0.5

    def he_init(self) -> None:
        """He (fan-in, ReLU) initialization of every layer followed by a ReLU, zero biases; the
        output modules keep PyTorch's default (small logits at the start)."""
        for layer in list(self.layers)[:-1]:
            for m in layer.modules():
                if isinstance(m, (nn.Linear, nn.Conv2d)):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                    if m.bias is not None:  # every layer of the pool has one
                        nn.init.zeros_(m.bias)

    def module(self, l: int, j: int) -> nn.Module:
        """Module j of layer l."""
        return cast(nn.ModuleList, self.layers[l])[j]  # a ModuleList of ModuleLists (torch types items as Module)

    def gate_count(self) -> int:
        m = self.sizes
        return m[0] + sum(m[l] * m[l - 1] for l in range(1, len(m))) + m[-1]

    def split(self, gates: Tensor) -> tuple[Tensor, list[Tensor], Tensor]:
        """Flat gates -> (input gates [M0], connection matrices [M_l, M_{l-1}], output gates)."""
        m = self.sizes
        g0, pos = gates[: m[0]], m[0]
        matrices = []
        for l in range(1, len(m)):
            matrices.append(gates[pos : pos + m[l] * m[l - 1]].view(m[l], m[l - 1]))
            pos += m[l] * m[l - 1]
        return g0, matrices, gates[pos:]

    def active(self, gates: Tensor) -> list[Tensor]:
        """Per layer, which modules receive an active input (bool [M_l])."""
        g0, matrices, _ = self.split(gates.detach())
        flags = [g0 > self.threshold]
        for a in matrices:
            flags.append(((a > self.threshold) & flags[-1][None, :]).any(1))
        return flags

    def forward(self, x: Tensor, gates: Tensor, tied: bool = False) -> Tensor:
        g0, matrices, g_out = self.split(gates)
        flags = self.active(gates)
        h = [self.module(0, 0 if tied else j)(x) * g0[j] for j in range(self.sizes[0])]
        for l, a in enumerate(matrices, start=1):
            total = a.sum(1)
            denominator = torch.where(total.detach() > 0, total, torch.ones_like(total))
            stacked = torch.stack(h)  # [M_{l-1}, B, D]
            inputs = torch.einsum("kj,jbd->kbd", a, stacked) / denominator[:, None, None]
            h = [self.module(l, 0 if tied else k)(inputs[k]) * flags[l][k].float() for k in range(self.sizes[l])]
        total = g_out.sum()
        return sum(g * out for g, out in zip(g_out, h)) / torch.where(total.detach() > 0, total, torch.ones_like(total))


class Router(nn.Module):
    """The routing hypernetwork: a set encoder over (x, one-hot y) pairs, mean-pooled into gate logits."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, gates: int, x_dim: int = 128, y_dim: int = 64):
        super().__init__()
        self.phi_x = _encoder(input_shape, 0, x_dim, channels=(16, 32))
        self.phi_y = nn.Linear(num_classes, y_dim)
        self.out = nn.Linear(x_dim + y_dim, gates)
        self.num_classes = num_classes

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        z = torch.cat([self.phi_x(x), self.phi_y(F.one_hot(y, self.num_classes).float())], dim=1)
        return self.out(torch.relu(F.normalize(z, dim=1))).mean(0)


class FedMNHP(Hyperparams):
    modules_per_layer: list[int] = Field(default_factory=lambda: [2, 2, 2], min_length=2)
    dims: list[int] = Field(default_factory=lambda: [512, 256])
    encoder_hidden: int = Field(2048, ge=0)  # LeNet encoder's hidden fc (0: none)
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    router_x_dim: int = Field(128, ge=1)
    router_y_dim: int = Field(64, ge=1)
    router_samples: int = Field(0, ge=0)  # 0: the whole local training set at every step [C]
    tau_init: float = Field(1.0, gt=0)
    tau_min: float = Field(0.5, gt=0)
    tau_rate: float = Field(3e-5, ge=0)
    sparsity: float = Field(0.0, ge=0)  # lambda of the optional mean-gate penalty [INF]
    gate_bias_init: float = 2.0  # initial gate logit: gates start on [INF, see doc]
    he_init: bool = True  # He init of the modules' ReLU layers [INF, see doc]
    send_routed_only: bool = True  # the communication-efficient interaction
    code_compat: bool = False  # the official code's behaviour (see module doc)


@ALGORITHMS.register(
    "fedmn",
    card=Card(
        display_name="FedMN",
        family="hypernetworks and layer-wise aggregation",
        paper="T. Wang, Cheng, Luo, Yu, Ni, Tong, Chen & X. Zhang, ICDM 2022",
        personalizes="the architecture: a routing hypernetwork picks each client's modules from a shared pool",
    ),
)
class FedMN(Algorithm[FedMNHP, RouterStates, RouterStates, PoolAndRouting]):
    """A module pool shared by all clients; each client's routing hypernetwork output picks its modules."""

    capabilities = Capabilities(
        batched=False,
        refused_knobs={
            "privacy": "its upload is the router and the modules its routing picks after local training, "
            "which may differ from the modules it downloaded: no update to clip"
        },
    )
    # Checkpoints: the server's pool and router, each client's copies, routing and step count; the module
    # pool and the routing net that local training loads each client into; which tensors make each module.
    state = ("server_pool", "server_router", "client_pool", "routing", "steps_done")
    state_objects = ("net", "router")
    state_rebuilt = ("module_names",)

    quick_hp = {
        "dims": [16, 8],
        "encoder_hidden": 16,
        "router_x_dim": 8,
        "router_y_dim": 4,
        "router_samples": 16,
    }  # small smoke cells (tests)

    search_space = {
        "tau_min": ("uniform", 0.1, 1.0),
        "tau_rate": ("loguniform", 1e-5, 1e-2),
        "sparsity": ("loguniform", 1e-4, 1e-1),
        "gate_bias_init": ("uniform", 0.0, 4.0),
    }

    # ---- state -----------------------------------------------------------------------------------
    def setup(self) -> None:
        fed, hp = self.engine, self.hp
        shape = fed.input_shape
        with fed.torch_global(INIT_STREAM):
            self.net = ModularNet(
                shape, fed.num_classes, hp.modules_per_layer, hp.dims, hp.encoder_hidden, hp.dropout
            ).to(fed.device)
            self.router = Router(shape, fed.num_classes, self.net.gate_count(), hp.router_x_dim, hp.router_y_dim).to(
                fed.device
            )
            if not hp.code_compat:
                if hp.he_init:
                    self.net.he_init()
                with torch.no_grad():
                    self.router.out.bias.add_(hp.gate_bias_init)
        self.net.threshold = 0.0 if hp.code_compat else 0.5
        self.module_names: dict[tuple[int, int], list[str]] = {}  # (layer, module) -> its tensor names
        for name in self.net.state_dict():
            _, l, j, _ = name.split(".", 3)
            self.module_names.setdefault((int(l), int(j)), []).append(name)
        self.server_pool = {n: t.detach().clone() for n, t in self.net.state_dict().items()}
        self.server_router = {n: t.detach().clone() for n, t in self.router.state_dict().items()}
        # What each client holds: its copies of the modules (stale where not downloaded lately),
        # its routing (None before its first training), its temperature schedule's step count.
        self.client_pool = [dict(self.server_pool) for _ in range(fed.num_clients)]
        self.routing: list[Tensor | None] = [None] * fed.num_clients
        self.steps_done = [0] * fed.num_clients

    def routed_modules(self, gates: Tensor | None) -> list[tuple[int, int]]:
        """The modules a routing uses (every module before the first routing, or in code_compat)."""
        if gates is None or self.hp.code_compat or not self.hp.send_routed_only:
            return list(self.module_names)
        return [(l, j) for l, flags in enumerate(self.net.active(gates)) for j in range(len(flags)) if flags[j]]

    def _module_tensors(self, pool: State, modules: Iterable[tuple[int, int]]) -> State:
        return {f"pool.{n}": pool[n] for m in modules for n in self.module_names[m]}

    # ---- gates -----------------------------------------------------------------------------------
    def gates(self, scores: Tensor, tau: float, train: bool, generator: torch.Generator | None = None) -> Tensor:
        """Gate values from the routing net's logits (see the module doc)."""
        if self.hp.code_compat:
            scores = scores.detach()
            noise = -torch.log(-torch.log(torch.rand(2, len(scores), generator=generator).clamp_min(1e-20)))
            soft = torch.softmax(torch.stack([-scores, scores]) + noise.to(scores.device), dim=0)[1]
            gates = torch.softmax(soft, dim=0)
            g0, _, _ = self.net.split(gates)
            return torch.cat([torch.ones_like(g0), gates[len(g0) :]])
        if train:
            u = torch.rand(len(scores), generator=generator).clamp(1e-6, 1 - 1e-6).to(scores.device)
            noisy = scores + torch.log(u) - torch.log1p(-u)
            soft = torch.sigmoid(noisy / tau)
            hard = self._force_path(scores.detach(), (noisy.detach() > 0).float())
            return hard + soft - soft.detach()  # straight-through
        return self._force_path(scores.detach(), (scores.detach() > 0).float())

    def _force_path(self, scores: Tensor, hard: Tensor) -> Tensor:
        """Turn on the best-scoring gate / edge among active modules where a layer has none."""
        hard = hard.clone()
        g0, matrices, g_out = self.net.split(hard)
        s0, s_matrices, s_out = self.net.split(scores)
        if g0.sum() == 0:
            g0[s0.argmax()] = 1
        active = g0 > 0
        for a, s in zip(matrices, s_matrices):
            reach = (a * active.float()).sum(1) > 0
            if not reach.any():
                masked = s.masked_fill(~active[None, :], float("-inf"))
                k, j = divmod(int(masked.argmax()), masked.shape[1])
                a[k, j] = 1
                reach = (a * active.float()).sum(1) > 0
            active = reach
        if (g_out * active.float()).sum() == 0:
            g_out[s_out.masked_fill(~active, float("-inf")).argmax()] = 1
        return hard

    def _client_data(self, fed: Engine, client: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Client `client`'s (a position of `fed`) router inputs: its train samples, or a draw of them."""
        idx = fed.sample_ids(client)
        if self.hp.router_samples and len(idx) > self.hp.router_samples:
            idx = idx[torch.randperm(len(idx), generator=generator)[: self.hp.router_samples].to(idx.device)]
        return fed.data(idx)

    @torch.no_grad()
    def _fixed_routing(self, fed: Engine, client: int, router_state: State) -> Tensor:
        """The routing `router_state` fixes for client `client` of `fed` (trained clients or newcomers)."""
        self.router.load_state_dict(router_state)
        x, y = self._client_data(fed, client, fed.generator(ROUTER_SAMPLES_STREAM, client=client))
        return self.gates(self.router(x, y), self.hp.tau_min, train=False)

    # ---- the round -------------------------------------------------------------------------------
    def configure(self, rnd: Round) -> Payload:
        return Payload.from_rows(
            [
                {
                    **{f"router.{n}": t for n, t in self.server_router.items()},
                    **self._module_tensors(self.server_pool, self.routed_modules(self.routing[c])),
                }
                for c in rnd.clients.tolist()
            ],
            rnd.clients,
        )

    def receive(self, rnd: ClientRound, download: Payload) -> RouterStates:
        states: RouterStates = []
        for c, received in zip(rnd.clients.tolist(), download.rows):
            for name, t in received.items():
                if name.startswith("pool."):
                    self.client_pool[c][name.removeprefix("pool.")] = t.clone()
            states.append(
                {
                    "router": {
                        n.removeprefix("router."): t.clone() for n, t in received.items() if n.startswith("router.")
                    }
                }
            )
        return states

    def local_train(self, rnd: ClientRound, states: RouterStates) -> RouterStates:
        fed, hp, sgd = self.engine, self.hp, self.engine.sgd
        clients = rnd.clients
        ids = clients.tolist()
        noise_generators = fed.batch_generators(rnd, clients, stream=NOISE_STREAM)
        batches, counts = step_ids(fed, rnd, clients)  # a straggler's share of the round's work
        for k, c in enumerate(ids):
            self.net.load_state_dict(self.client_pool[c])
            self.router.load_state_dict(states[k]["router"])
            params: list[Tensor] = [*self.net.parameters(), *self.router.parameters()]
            momenta = sgd.momenta(params)
            module_params = {
                m: [p for n, p in self.net.named_parameters() if n in set(names)]
                for m, names in self.module_names.items()
            }
            self.net.train()
            gates = None
            with torch.random.fork_rng(devices=[]):
                fed.seed_torch_global(DROPOUT_STREAM, rnd.number, int(fed.client_ids[c]))  # dropout
                for step in range(int(counts[k])):
                    tau = max(hp.tau_init * math.exp(-hp.tau_rate * self.steps_done[c]), hp.tau_min)
                    if hp.code_compat:
                        tau = hp.tau_init  # the annealing test in the code never fires
                    scores = self.router(*self._client_data(fed, c, noise_generators[k]))
                    gates = self.gates(scores, tau, train=True, generator=noise_generators[k])
                    x, y = fed.data(batches[k, step])
                    logits = self.net(x, gates, tied=hp.code_compat)
                    loss = F.cross_entropy(logits, y)
                    if hp.sparsity:
                        loss = loss + hp.sparsity * torch.sigmoid(scores).mean()
                    if not torch.isfinite(loss):
                        raise Diverged(f"non-finite local loss for client {c}")
                    for p in params:
                        p.grad = None
                    loss.backward()
                    if not hp.code_compat:  # modules off this step stay as they are (no decay, no momentum)
                        used = {(l, j) for l, f in enumerate(self.net.active(gates)) for j in range(len(f)) if f[j]}
                        for m, ps in module_params.items():
                            if m not in used:
                                for p in ps:
                                    p.grad = None
                    _sgd_step(sgd, params, momenta)
                    self.steps_done[c] += 1
            self.client_pool[c] = {n: t.detach().clone() for n, t in self.net.state_dict().items()}
            router_state = {n: t.detach().clone() for n, t in self.router.state_dict().items()}
            if hp.code_compat and gates is not None:
                self.routing[c] = gates.detach().clone()  # the last batch's gates, frozen
            else:
                self.routing[c] = self._fixed_routing(fed, c, router_state)
            states[k] = {"router": router_state}
        return states

    def send(self, rnd: ClientRound, states: RouterStates) -> Payload:
        return Payload.from_rows(
            [
                {
                    **{f"router.{n}": t for n, t in state["router"].items()},
                    **self._module_tensors(self.client_pool[c], self.routed_modules(self.routing[c])),
                }
                for c, state in zip(rnd.clients.tolist(), states)
            ],
            rnd.clients,
        )

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        rows = upload.rows
        for name in self.server_router:  # the routing net: unweighted mean over the round's clients
            self.server_router[name] = (
                torch.stack([u[f"router.{name}"] for u in rows]).float().mean(0).to(self.server_router[name].dtype)
            )
        for name in self.server_pool:  # each module: mean over the clients that sent it, else kept
            sent = [u[f"pool.{name}"] for u in rows if f"pool.{name}" in u]
            if sent:
                self.server_pool[name] = torch.stack(sent).float().mean(0).to(self.server_pool[name].dtype)

    # ---- evaluation and artifacts ---------------------------------------------------------------------
    def personalized(self) -> PoolAndRouting:
        """The aggregated pool and every client's frozen routing. A client not trained yet has none:
        it is scored with the routing the server's routing net fixes from its data now, made for this
        evaluation only and never kept in `self.routing`, which `configure` reads to decide what to
        send (evaluation must not write what training reads)."""
        routing = [
            fixed if fixed is not None else self._fixed_routing(self.engine, c, self.server_router)
            for c, fixed in enumerate(self.routing)
        ]
        return {"pool": self.server_pool, "routing": torch.stack(routing)}

    def evaluate(self, serving: Serving, models: PoolAndRouting, splits: tuple[str, ...]) -> Scores:
        """Each client's routed pool scored on its own splits (the engine cannot call this model)."""
        fed = serving.clients
        self.net.load_state_dict(models["pool"])
        scores: Scores = {}
        for split in splits:
            accuracy = torch.zeros(fed.num_clients, device=fed.device)
            loss = torch.zeros(fed.num_clients, device=fed.device)
            for c in range(fed.num_clients):
                accuracy[c], loss[c] = self._score(fed, c, models["routing"][c], split)
            scores[split] = (accuracy, loss)
        return scores

    @torch.no_grad()
    def _score(self, fed: Engine, client: int, gates: Tensor, split: str) -> tuple[float, float]:
        """Accuracy and loss of `self.net` (as loaded) with `gates` on client `client`'s own `split` (of `fed`)."""
        idx = fed.sample_ids(client, split)
        if not len(idx):
            return float("nan"), float("nan")
        self.net.eval()
        correct = total = 0.0
        for part in idx.split(2048):
            x, y = fed.data(part)
            logits = self.net(x, gates, tied=self.hp.code_compat)
            total += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
        return correct / len(idx), total / len(idx)

    def adapt_locally(self, serving: Serving, models: PoolAndRouting) -> Scored:
        """The after-local-adaptation protocol for a routed pool: each client trains its copy of the
        aggregated modules through its own frozen routing (cross-entropy, the cell's SGD, the batch
        order of the round after `serving.round`, as `Engine.adapt_locally`; the routing net is not
        adapted). A pool per client would not fit in memory at 100 clients (FedMN's modules are large),
        so each client's adapted pool is scored on every evaluated split as soon as it is trained and
        then dropped: the result is `Scored`, which the engine takes as the adapted models' scores."""
        fed, sgd, rnd = serving.clients, serving.clients.sgd, serving.round
        everyone = torch.arange(fed.num_clients, device=fed.device)
        batches, counts = step_ids(fed, rnd + 1, everyone, epochs=serving.adapt_epochs)
        splits = [name for name in ("test", "val") if name in fed.split_names]
        scores = {
            name: (torch.zeros(fed.num_clients, device=fed.device), torch.zeros(fed.num_clients, device=fed.device))
            for name in splits
        }
        with torch.random.fork_rng(devices=[]):  # dropout draws must not move the training's stream
            for c in range(fed.num_clients):
                fed.seed_torch_global(ADAPT_DROPOUT_STREAM, rnd, c)
                self.net.load_state_dict(models["pool"])
                gates = models["routing"][c]
                params: list[Tensor] = list(self.net.parameters())
                momenta = sgd.momenta(params)
                self.net.train()
                for step in range(int(counts[c])):
                    x, y = fed.data(batches[c, step])
                    loss = F.cross_entropy(self.net(x, gates, tied=self.hp.code_compat), y)
                    if not torch.isfinite(loss):
                        raise Diverged(f"non-finite adaptation loss for client {c}")
                    for p in params:
                        p.grad = None
                    loss.backward()
                    _sgd_step(sgd, params, momenta)
                for name in splits:
                    scores[name][0][c], scores[name][1][c] = self._score(fed, c, gates, name)
        return Scored(scores)

    def newcomer_models(self, serving: Serving) -> PoolAndRouting:
        routing = [
            self._fixed_routing(serving.clients, c, self.server_router) for c in range(serving.clients.num_clients)
        ]
        return {"pool": self.server_pool, "routing": torch.stack(routing)}

    def artifacts(self) -> dict[str, np.ndarray]:
        """`routing`: every client's gates [clients, gates] (input gates, connection matrices row by
        row, output gates), as used for evaluation."""
        return {"routing": torch.stack(self.personalized()["routing"].unbind()).cpu().numpy()}
