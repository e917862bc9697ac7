"""Privacy heterogeneity (the cell's `privacy` knob): client-level differential privacy on what the
clients upload, local (each client noises its own upload, each with its own budget) or central (the
server clips each update and noises their sum: DP-FedAvg).

**Local DP** (`mode: local`, the default): the update u = upload - download (or the upload itself
where it already is an update, e.g. pFedHN's and pFedLA's deltas) is clipped to L2 norm `clip` over
all its floating-point tensors and N(0, (z_i * S)^2) noise is added to every coordinate before it
leaves the client, S the sensitivity below. What the client keeps locally is not noised: its own
data may shape its own model freely; only what leaves it is private. Accounting, per client: one
Gaussian mechanism per upload, composed over the rounds with Opacus's RDP accountant. No
amplification by subsampling is claimed: the server sees who uploads, and the schedule is drawn in
advance from the seed, so every participation is counted at sampling rate 1. Each client's noise
multiplier z_i is calibrated from its budget epsilon_i (at `delta`) over its number of participations
in the schedule, known in advance (`opacus.accountants.utils.get_noise_multiplier`); the epsilon
reported per client is the accountant's over the uploads that actually left it (a dropped upload,
`system.dropout`, never left), so it is at most its budget. `epsilon` is one budget for every client,
or a list of budgets: groups of clients, equal in size, each client's group drawn once from the seed;
`null` in the list is a group without DP.

**Central DP** (`mode: central`; DP-FedAvg, McMahan, Ramage, Talwar & Zhang, ICLR 2018): the clients
send their updates as they are to a trusted server, which clips each arrived update to `clip`, sums
them, adds N(0, (z * S)^2) to every coordinate of the sum and divides by the number of updates that
arrived (public: dropouts are drawn from the seed, not the data). Every arrived client receives that
one noised mean, so the algorithm's own averaging (a weighted mean of identical rows) aggregates
exactly it: under central DP the aggregation weights are uniform over the arrived clients, not the
data sizes (which would make a client's influence, and so the sensitivity, depend on its size). One
budget for the population (a list is refused); the accountant is Opacus's RDP accountant for the
subsampled Gaussian mechanism over the rounds, at sampling rate q = clients per round / clients (the
cell's participation), the multiplier z calibrated for all scheduled rounds and the epsilon reported
over the rounds that released an aggregate. Algorithms whose server uses each client's update on its
own (pFedHN, pFedLA, MH-pFedHN: a per-client hypernetwork step or aggregation) cannot be given a noised
sum and refuse central DP (`refused_knobs["privacy.mode"]`).

**A method wrapping a method, not a branch of the rounds**: under the knob the cell's method is
`DifferentiallyPrivate(method)`, itself an `Algorithm` (as Flower's
`DifferentialPrivacyServerSideFixedClipping(strategy, ...)` is a strategy wrapping a strategy), for a
method whose upload is a model or an update (`Algorithm.dp_upload`). It is wrapped once, where the
cell's method is built (`with_privacy`, called by `pflbench.simulator.cell_method`); the round driver
(`pflbench.simulator.rounds`) runs it like any method and has no privacy code; the knob's accounting reaches the
cell's summary through the wrapper's `facts()`. The wrapper changes what leaves the clients: the round's
upload (`send`: the update formed against the round's download, `Round.download`; the method's
`aggregate` receives the privatized uploads as it would its own) and, for a server that updates after
each client, each upload delivered during local training (`local_train`, `rnd.deliver`); every other
hook is the method's. A method that privatizes where its update leaves the client itself
(`dp_upload = "self"`; no built-in does) is not wrapped, and reports its own accounting (`facts()`);
one that cannot be privatized refuses the knob.

**Neighbouring relation** (`relation`), the sensitivity S of one client's contribution:
`add_remove` (default): a client's data present or absent, i.e. its update replaced by the zero
update: S = clip. `replace`: a client's data replaced by any other (the usual definition of local DP
over any two inputs): S = 2 * clip. z is calibrated the same way under both; the noise scales with S,
so at the same epsilon `replace` adds twice the noise. The relation is stated in every summary
(`privacy_relation`). The RDP accountant's subsampling bound (central DP, q < 1) is the one for
Poisson sampling under add/remove; the schedule here samples a fixed number of clients per round, the
usual simplification (Opacus makes it for shuffled batches), stated, not corrected.

**BatchNorm statistics stay on the client under DP.** BatchNorm's running mean and
variance (and its step counter) are computed from the client's data, so they cannot leave it
un-noised; noised, the averaged variance goes negative and evaluation gives NaN (FedAvg, cnn-bn,
generated 32x32 images: "diverged: non-finite test loss"), and, inside the clipped vector, they spend
most of the clip (measured on fmnist Dir(0.3), 20 clients, cnn-bn, lr 0.05, 2 epochs, rounds 1-2: the
statistics' delta has L2 norm 2.4-3.5, the parameters' 0.44-0.76, so clipping the whole update to 1
left the parameters 0.29-0.41 of theirs). Two fixes were possible:
clamp the variance after aggregation (post-processing, free under DP), or keep the statistics local.
Chosen: local, as SiloBN does (Andreux et al., 2020): they are not clipped, noised or uploaded, the
server's copy never moves, and every client's model keeps its own statistics
(`FedAvg.stays_on_client`, `pflbench.fedavg`); the clip and the budget go to the learned parameters alone. A clamp
would have left evaluation with statistics as noisy as the weights and the clip mostly spent on them.
Under the knob this holds for every client of the cell (a client without DP included: one rule for
the cell's models). A newcomer (`unseen_fraction`) under DP gets the initial statistics of a
FedAvg-shaped model (no client's statistics reach the server).

**Side channels the simulation leaves open** (the guarantee above covers the noised tensors only):
- data sizes: under local DP the server weights the uploads by the clients' train sizes
  (`Federation.train_sizes`), known to it in clear (central DP's mean is uniform);
- integer tensors pass un-noised (they carry no gradient): BatchNorm's step counter
  (`num_batches_tracked`, counting the client's local batches, so its data size) did so before the
  statistics stayed local; any integer tensor an algorithm uploads still would;
- the noise is drawn from generators of the stream "privacy.noise" keyed by (seed, round, client): anyone
  who knows the cell's seed (it is in the public configuration) can subtract it. It makes runs
  reproducible and the same for every algorithm; a deployment would draw it from secret randomness.
  The same holds for the sampling schedule that central DP's amplification assumes hidden.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, cast

import numpy as np
import torch
from pydantic import Field, ValidationError, field_validator, model_validator

from pflbench import streams
from pflbench.algorithm import Algorithm, AnyAlgorithm, Hyperparams
from pflbench.capabilities import Refusal
from pflbench.payload import Payload
from pflbench.round_context import ClientRound, Round
from pflbench.serving import Scores, Serving
from pflbench.simulator.system import KnobParams, knob_problem

if TYPE_CHECKING:
    from pflbench.config import CellConfig
    from pflbench.simulator.client_model import ClientModel

CENTRAL = -1  # the generator key of the server's noise (no client has id -1)
ACCOUNTANT = "rdp"  # Opacus's Renyi-DP accountant (Mironov 2017; Mironov, Talwar & Zhang 2019)
# Renyi orders tried by the accountant: Opacus's defaults (1.1 .. 63) widened at both ends, because
# budgets here range from well below 1 to tens over few releases (the defaults then warn that the best
# order is at their edge, and give a looser bound).
ALPHAS = (
    [1 + x / 100 for x in range(1, 10)]
    + [1 + x / 10.0 for x in range(1, 100)]
    + list(range(12, 64))
    + list(range(64, 1025, 16))
)
RELATIONS = ("add_remove", "replace")
MODES = ("local", "central")
SENSITIVITY = {"add_remove": 1.0, "replace": 2.0}  # one client's contribution, in units of `clip`


class PrivacyParams(KnobParams):
    """The `privacy.*` entries of a cell; privacy is on when `epsilon` is given."""

    epsilon: float | list[float | None] | None = None  # budget per client, or budgets of groups of clients
    delta: float = Field(default=1e-5, gt=0.0, lt=1.0)
    clip: float = Field(default=1.0, gt=0.0)  # L2 norm the update is clipped to
    relation: Literal["add_remove", "replace"] = "add_remove"  # neighbouring datasets (sensitivity clip or 2 clip)
    mode: Literal["local", "central"] = "local"  # who noises: each client its upload, or the server the sum
    text_entries = frozenset({"relation", "mode"})

    @field_validator("epsilon")
    @classmethod
    def _positive(cls, value: float | list[float | None] | None) -> float | list[float | None] | None:
        values = [value] if not isinstance(value, list) else value
        if isinstance(value, list) and not value:
            raise ValueError("give at least one budget")
        if any(isinstance(v, bool) or (v is not None and not (0 < v < math.inf)) for v in values):
            raise ValueError(f"budgets must be positive finite numbers (null: a group without DP), got {value!r}")
        return value

    @model_validator(mode="after")
    def _central_has_one_budget(self) -> PrivacyParams:
        if self.mode == "central" and isinstance(self.epsilon, list):
            raise ValueError(
                f"epsilon: central DP has one budget for the whole population, got the list "
                f"{self.epsilon!r} (give one number, or mode local for budgets per group)"
            )
        return self

    @property
    def sensitivity(self) -> float:
        """The L2 sensitivity of one client's (clipped) contribution under `relation`."""
        return SENSITIVITY[self.relation] * self.clip


def parse_privacy(values: dict[str, Any]) -> dict[str, Any]:
    """The cell's `privacy` entries validated, keeping only those that differ from the defaults (a
    default written out gives the same cell hash as leaving it out). ValueError naming the entry."""
    allowed = (
        "epsilon (a positive budget, or a list of budgets for groups of clients, null = no DP), "
        "delta (default 1e-5), clip (L2 norm of the update, default 1.0), "
        f"relation ({' | '.join(RELATIONS)}, default add_remove), mode ({' | '.join(MODES)}, default local)"
    )
    try:
        params = PrivacyParams(**values)
    except ValidationError as err:
        problems = "; ".join(knob_problem("privacy", e) for e in err.errors())
        raise ValueError(f"{problems} (allowed: {allowed})") from None
    data = params.model_dump(mode="json")
    defaults = PrivacyParams().model_dump(mode="json")
    kept = {k: v for k, v in data.items() if v != defaults[k]}
    if kept and params.epsilon is None:
        raise ValueError(f"privacy.epsilon is required when privacy is on (allowed: {allowed})")
    return kept


@cache
def noise_multiplier(epsilon: float, delta: float, releases: int, sample_rate: float = 1.0) -> float:
    """z such that `releases` Gaussian mechanisms (subsampled at `sample_rate`) spend at most `epsilon`."""
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=releases,
            accountant=ACCOUNTANT,
            alphas=ALPHAS,
        )
    )


def epsilon_spent(z: float, releases: int, delta: float, sample_rate: float = 1.0) -> float:
    """The accountant's epsilon at `delta` after `releases` Gaussian mechanisms of multiplier z."""
    if releases == 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(releases):
        accountant.step(noise_multiplier=z, sample_rate=sample_rate)
    return float(accountant.get_epsilon(delta, alphas=ALPHAS))


def batchnorm_statistics(models: Iterable[ClientModel]) -> frozenset[str]:
    """The BatchNorm buffers (running mean and variance, step counter) of the cell's models."""
    return frozenset(n for m in models for n in m.buffer_names if n in m.batchnorm_names)


def _norm(tensors: list[torch.Tensor]) -> float:
    # the sum of tensors is a tensor (never the start 0: `tensors` is not empty there)
    return float(torch.sqrt(cast(torch.Tensor, sum((t.double() ** 2).sum() for t in tensors)))) if tensors else 0.0


def _clipped(update: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """The floating tensors of `update` scaled together to L2 norm at most `clip`."""
    scale = min(1.0, clip / (_norm([t for t in update.values() if t.is_floating_point()]) + 1e-12))
    return {n: t * scale if t.is_floating_point() else t for n, t in update.items()}


class PrivacyPlan:
    """Local DP: every client's budget and noise multiplier, the noising of uploads, and the releases
    so far. `kept_local`: the tensors that never leave a client under the knob (BatchNorm statistics)."""

    mode = "local"
    # the noise multipliers: one per client here (an array), one for the population in CentralPrivacyPlan
    # (a float), which shares this class's noising and summary but not its per-client state
    z: Any

    def __init__(
        self,
        params: PrivacyParams,
        clients: int,
        schedule: np.ndarray,
        seed: int,
        kept_local: frozenset[str] = frozenset(),
    ) -> None:
        self.params, self.seed, self.kept_local = params, seed, kept_local
        budgets = params.epsilon if isinstance(params.epsilon, list) else [params.epsilon]
        order = streams.generator(seed, "privacy.budgets", kind="numpy").permutation(clients)
        self.budget: list[float | None] = [None] * clients
        for budget, members in zip(budgets, np.array_split(order, len(budgets))):
            for c in members.tolist():
                self.budget[c] = budget
        self.participations = np.bincount(schedule.ravel(), minlength=clients)
        self.z = np.array(
            [
                noise_multiplier(b, params.delta, int(n)) if b is not None and n > 0 else 0.0
                for b, n in zip(self.budget, self.participations)
            ]
        )
        self.releases = np.zeros(clients, dtype=np.int64)

    @classmethod
    def from_cell(
        cls, cell: CellConfig, schedule: np.ndarray, population: int | None = None, models: Iterable[ClientModel] = ()
    ) -> PrivacyPlan | CentralPrivacyPlan | None:
        """The cell's plan (None when the knob is off): `schedule` in partition ids, `population` the
        number of clients the schedule samples from (central DP's sampling rate), `models` the cell's."""
        if not cell.privacy:
            return None
        params = PrivacyParams(**cell.privacy)
        kept = batchnorm_statistics(models)
        if params.mode == "central":
            return CentralPrivacyPlan(params, schedule, population or cell.clients, cell.seed, kept)
        return cls(params, cell.clients, schedule, cell.seed, kept)

    def _generator(self, rnd: int, client: int) -> torch.Generator:
        return streams.generator(self.seed, "privacy.noise", rnd, client)

    def _noised(self, rnd: int, key: int, update: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """`update` plus N(0, std^2) on every coordinate of its floating tensors."""
        gen = self._generator(rnd, key)
        out: dict[str, torch.Tensor] = {}
        for n, t in update.items():
            if not t.is_floating_point():
                out[n] = t
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(device=t.device, dtype=t.dtype)
            out[n] = t + std * noise
        return out

    def privatize(self, rnd: int, client: int, update: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One client's update (unstacked tensors) clipped and noised with its own multiplier; counts
        the release. A client without DP (budget null) sends its update as it is."""
        self.releases[client] += 1
        if self.budget[client] is None:
            return update
        return self._noised(
            rnd, client, _clipped(update, self.params.clip), float(self.z[client]) * self.params.sensitivity
        )

    def _common(self) -> dict:
        return {
            "privacy_mode": self.mode,
            "privacy_relation": self.params.relation,
            "privacy_delta": self.params.delta,
            "privacy_clip": self.params.clip,
            "privacy_sensitivity": self.params.sensitivity,
            "privacy_kept_on_clients": sorted(self.kept_local),
        }

    def summary(self) -> dict:
        """Per client: the budget, the multiplier, the uploads released and the epsilon spent at delta
        (None for a client without DP); the cell's max and mean over the clients with DP."""
        delta = self.params.delta
        spent = [
            None if b is None else epsilon_spent(float(z), int(r), delta)
            for b, z, r in zip(self.budget, self.z, self.releases)
        ]
        private = [e for e in spent if e is not None]
        return {
            **self._common(),
            "privacy_budget": self.budget,
            "privacy_noise_multiplier": [float(z) for z in self.z],
            "privacy_releases": self.releases.tolist(),
            "privacy_epsilon": spent,
            "privacy_epsilon_max": max(private) if private else None,
            "privacy_epsilon_mean": float(np.mean(private)) if private else None,
        }


class CentralPrivacyPlan(PrivacyPlan):
    """Central DP (DP-FedAvg): one multiplier for the population, calibrated for the scheduled rounds
    at sampling rate q; the server's noise on the sum of the round's clipped updates."""

    mode = "central"

    def __init__(
        self,
        params: PrivacyParams,
        schedule: np.ndarray,
        population: int,
        seed: int,
        kept_local: frozenset[str] = frozenset(),
    ) -> None:
        self.params, self.seed, self.kept_local = params, seed, kept_local
        self.rounds = len(schedule)
        self.sample_rate = min(1.0, schedule.shape[1] / population) if self.rounds else 1.0
        # one budget: PrivacyParams refuses a list under central DP
        self.z = noise_multiplier(cast(float, params.epsilon), params.delta, self.rounds, self.sample_rate)
        self.released_rounds = 0

    def privatize(self, rnd: int, client: int, update: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise RuntimeError(
            "privacy.mode central: the server noises the sum of the round's updates; no "
            "client privatizes its own (the algorithm should have been refused)"
        )

    def noised_mean(self, rnd: int, updates: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """(sum of the updates, each clipped to `clip`, + N(0, (z S)^2)) / len(updates); one release."""
        self.released_rounds += 1
        clipped = [_clipped(u, self.params.clip) for u in updates]
        total = {
            n: torch.stack([u[n] for u in clipped]).sum(0) if t.is_floating_point() else t
            for n, t in clipped[0].items()
        }
        noised = self._noised(rnd, CENTRAL, total, self.z * self.params.sensitivity)
        return {n: t / len(updates) if t.is_floating_point() else t for n, t in noised.items()}

    def summary(self) -> dict:
        spent = epsilon_spent(self.z, self.released_rounds, self.params.delta, self.sample_rate)
        return {
            **self._common(),
            "privacy_budget": self.params.epsilon,
            "privacy_noise_multiplier": self.z,
            "privacy_sampling_rate": self.sample_rate,
            "privacy_releases": self.released_rounds,
            "privacy_epsilon": spent,
            "privacy_epsilon_max": spent,
            "privacy_epsilon_mean": spent,
        }


def privacy_caption(settings: list[str]) -> str:
    """The sentence a report caption adds where some of its columns are privacy settings (`privacy.*=`
    items of a knob setting): which DP and which neighbouring relation, unless a column says otherwise."""
    if not any("privacy." in setting for setting in settings):
        return ""
    return (
        " DP: local (each client noises its upload) unless a column says privacy.mode=central (the server "
        "noises the sum); neighbouring relation add/remove (sensitivity = clip) unless it says "
        "privacy.relation=replace (sensitivity 2 x clip)."
    )


def privatize_upload(
    plan: PrivacyPlan,
    mode: str,
    rnd: int,
    clients: torch.Tensor,
    download: Payload | None,
    upload: Payload,
    arrived: torch.Tensor | None,
) -> list[dict[str, torch.Tensor]]:
    """The round's uploads as the server receives them, one dict per client: with `mode` "model" the
    update is upload - download (tensor by tensor), with "update" the upload itself. Dropped uploads
    (`arrived` False) never leave and come back as {}; the tensors in `plan.kept_local` never leave."""
    out: list[dict[str, torch.Tensor]] = []
    updates: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]] = {}
    for k, c in enumerate(clients.tolist()):
        mine = {} if arrived is not None and not bool(arrived[k]) else upload.row(k)
        mine = {n: t for n, t in mine.items() if n not in plan.kept_local}
        out.append({})
        if not mine:  # dropped, or nothing leaves this client (e.g. Local): no release
            continue
        if mode == "update" or (plan.mode == "local" and plan.budget[c] is None):
            updates[k] = (mine, None)  # already an update, or no DP: the upload leaves as it is
            continue
        reference = download.row(k) if download is not None else {}
        missing = [n for n in mine if n not in reference]
        if missing:
            raise ValueError(
                f"privacy: upload tensors {missing[:3]} have no downloaded counterpart, so the "
                f"update upload - download is undefined for this algorithm"
            )
        updates[k] = (
            {n: t - reference[n].to(t.dtype) if t.is_floating_point() else t for n, t in mine.items()},
            reference,
        )
    if plan.mode == "central" and updates:
        mean = cast(CentralPrivacyPlan, plan).noised_mean(rnd, [u for u, _ in updates.values()])
        updates = {k: (mean, reference) for k, (_, reference) in updates.items()}
    for k, (update, base) in updates.items():  # base: the download the update is against, or None
        if plan.mode == "local":
            update = plan.privatize(rnd, int(clients[k]), update)
        if base is None:
            out[k] = update
        else:
            out[k] = {n: base[n].to(t.dtype) + t if t.is_floating_point() else t for n, t in update.items()}
    return out


class CellFederation(Protocol):
    """What the wrapper uses of the cell's Federation (`pflbench.simulator.federation.Federation`; named by what it
    offers, since the Federation imports this module for the knob's `PrivacyPlan`): the plan, the
    clients' ids, whose uploads arrive (system.dropout), and one client's update privatized."""

    @property
    def privacy(self) -> PrivacyPlan | None: ...

    @property
    def client_ids(self) -> np.ndarray: ...

    def arrived(self, rnd: int | Round, clients: torch.Tensor) -> torch.Tensor | None: ...

    def privatize(self, rnd: int | Round, client: int, update: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


class DifferentiallyPrivate(Algorithm[Hyperparams, Any, Any, Any]):
    """A method whose uploads leave each client privatized (the `privacy` knob): an `Algorithm` that
    wraps another, as Flower's `DifferentialPrivacyClientSideFixedClipping(strategy, ...)` wraps a
    strategy. It wraps a method whose upload is a model (`dp_upload = "model"`: the update is upload -
    download, the download being the round's, `rnd.download`) or an update (`"update"`).

    What it changes: `send` returns what the server receives, the privatized uploads, one per client,
    in the method's form (read stacked where the method's upload was), the ones lost to
    `system.dropout` never released; the method's `aggregate` receives them as any upload. For a server
    that updates after each client (`updates_per_client`) the uploads leave one by one during local
    training (`rnd.deliver`): `local_train` privatizes each as it leaves its client, and the round's
    upload is not privatized again. `facts()` adds the knob's accounting to the method's facts.

    Everything else is the method's, delegated hook by hook (no attribute lookup falls through):
    its class-level declarations (`name`, `card`, `capabilities`, `Hyperparams`, `search_space`,
    `quick_hp`: `WRAPPED_DECLARATIONS`, copied onto the wrapper's class for that method, `wrapping`),
    its hyperparameters and engine (`hp`, `engine`: the same objects), and every hook of `Algorithm`,
    checkpoints included. The wrapper holds no state of its own: `state_dict()` is the method's, and the
    release counts the accountant reads are the privacy plan's, which the engine owns and a checkpoint
    saves with the Federation (`pflbench.storage.checkpoint.federation_state`), so a wrapped method resumes
    bit-identical. Build it with `with_privacy`."""

    # The method's class-level declarations the wrapper's class takes over (`wrapping`).
    WRAPPED_DECLARATIONS: ClassVar[tuple[str, ...]] = (
        "name",
        "card",
        "capabilities",
        "Hyperparams",
        "search_space",
        "quick_hp",
    )
    wrapped: ClassVar[type[AnyAlgorithm]] = Algorithm  # the wrapped method's class (`wrapping`)
    state: ClassVar[tuple[str, ...]] = ()  # no state of its own (the class doc): `state_dict` is the method's
    state_objects: ClassVar[tuple[str, ...]] = ()
    state_rebuilt: ClassVar[tuple[str, ...]] = ()

    def __init__(self, algorithm: AnyAlgorithm, fed: CellFederation) -> None:
        if type(self).wrapped is Algorithm:
            raise TypeError(
                "DifferentiallyPrivate wraps a given method's class: build it with "
                "with_privacy(algorithm, fed), or DifferentiallyPrivate.wrapping(type(algorithm))"
            )
        if type(algorithm) is not type(self).wrapped:  # its class-level declarations are that class's exactly
            raise TypeError(
                f"{type(self).__name__} wraps a {type(self).wrapped.__name__}, not a "
                f"{type(algorithm).__name__}: build it with with_privacy(algorithm, fed)"
            )
        if fed.privacy is None:
            raise ValueError("DifferentiallyPrivate: the cell's privacy knob is off (no privacy plan to apply)")
        super().__init__(algorithm.engine, algorithm.hp)
        self.algorithm = algorithm  # the method, as it would run without the knob
        self.federation = fed  # the cell's Federation: which uploads arrive (system.dropout), the client ids
        self.plan: PrivacyPlan = fed.privacy  # the knob's plan (its release counts are the engine's state)

    @classmethod
    def wrapping(cls, method: type[AnyAlgorithm]) -> type[DifferentiallyPrivate]:
        """The wrapper's class for `method`'s instances: this class with `method`'s class-level
        declarations (`WRAPPED_DECLARATIONS`), so what is read from the class (`type(alg).card`,
        `type(alg).name`) is the method's. One class per method (cached)."""
        made = _WRAPPER_CLASSES.get((cls, method))
        if made is None:
            declarations = {name: getattr(method, name) for name in cls.WRAPPED_DECLARATIONS}
            name = f"{cls.__name__}[{method.__qualname__}]"
            made = cast(
                "type[DifferentiallyPrivate]",
                type(
                    name,
                    (cls,),
                    {
                        "__module__": cls.__module__,
                        "__qualname__": name,
                        "__doc__": cls.__doc__,
                        "wrapped": method,
                        **declarations,
                    },
                ),
            )
            _WRAPPER_CLASSES[cls, method] = made
        return made

    # ---- the method's class-level contract ----------------------------------------------------------
    @classmethod
    def parse_hyperparams(cls, values: dict[str, Any]) -> Hyperparams:
        return cls.wrapped.parse_hyperparams(values)

    @classmethod
    def check_cell(cls, cell: CellConfig) -> None:
        cls.wrapped.check_cell(cell)

    @classmethod
    def cell_refusal(cls, cell: CellConfig) -> Refusal | None:
        return cls.wrapped.cell_refusal(cell)

    # ---- state and what leaves the client ---------------------------------------------------------
    def setup(self) -> None:
        self.algorithm.setup()

    @property
    def dp_upload(self) -> str:
        return self.algorithm.dp_upload

    # ---- the round's hooks ---------------------------------------------------------------------------
    def configure(self, rnd: Round) -> Payload:
        return self.algorithm.configure(rnd)

    def receive(self, rnd: ClientRound, download: Payload) -> Any:
        return self.algorithm.receive(rnd, download)

    def local_train(self, rnd: ClientRound, state: Any) -> Any:
        """The method's local training; for a server that updates after each client, each upload it
        delivers (`rnd.deliver`) privatized as it leaves its client, before it goes on to the server."""
        if not self.algorithm.updates_per_client:
            return self.algorithm.local_train(rnd, state)
        fed, server = self.federation, rnd.deliver

        def deliver(upload: Payload) -> Payload | None:
            """Each arrived row privatized as it leaves its client, then on to the server."""
            arrived = fed.arrived(rnd, upload.clients)
            rows = [
                upload.row(k) if arrived is not None and not bool(arrived[k]) else fed.privatize(rnd, c, upload.row(k))
                for k, c in enumerate(upload.clients.tolist())
            ]
            return server(Payload.from_rows(rows, upload.clients, upload.header, stacked=upload.is_stacked))

        return self.algorithm.local_train(dataclasses.replace(rnd, deliver=deliver), state)

    def send(self, rnd: ClientRound, state: Any) -> Payload:
        """What the server receives of the method's upload: each client's privatized (local DP), or the
        server's noised mean of the arrived updates (central DP); the lost ones marked, never released."""
        fed = self.federation
        upload = self.algorithm.send(rnd, state)
        if self.algorithm.updates_per_client:  # privatized as each left its client (local_train)
            return upload
        arrived = fed.arrived(rnd, rnd.clients)
        received = privatize_upload(
            self.plan,
            self.algorithm.dp_upload,
            rnd.number,
            torch.as_tensor(fed.client_ids)[rnd.clients.cpu()],
            rnd.download,
            upload,
            arrived,
        )
        return Payload.from_rows(received, rnd.clients, upload.header, stacked=upload.is_stacked).delivered(arrived)

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        self.algorithm.aggregate(rnd, upload)

    @property
    def updates_per_client(self) -> bool:
        return self.algorithm.updates_per_client

    def aggregate_client(self, rnd: ClientRound, upload: Payload) -> None:
        """The method's server step on one client's upload, privatized already (`local_train`)."""
        self.algorithm.aggregate_client(rnd, upload)

    # ---- evaluation's hooks --------------------------------------------------------------------------
    def personalized(self) -> Any:
        return self.algorithm.personalized()

    def evaluate(self, serving: Serving, models: Any, splits: tuple[str, ...]) -> Scores:
        return self.algorithm.evaluate(serving, models, splits)

    def adapt_locally(self, serving: Serving, models: Any) -> Any:
        return self.algorithm.adapt_locally(serving, models)

    def newcomer_models(self, serving: Serving) -> Any:
        return self.algorithm.newcomer_models(serving)

    # ---- checkpoints, artifacts and facts ----------------------------------------------------------
    def state_dict(self) -> dict:
        """The method's state: the wrapper has none of its own (the class doc)."""
        return self.algorithm.state_dict()

    def check_state(self) -> None:
        self.algorithm.check_state()

    def load_state_dict(self, state: dict) -> None:
        self.algorithm.load_state_dict(state)

    def artifacts(self) -> dict[str, np.ndarray]:
        return self.algorithm.artifacts()

    def facts(self) -> dict[str, Any]:
        """The method's facts and the knob's accounting (`PrivacyPlan.summary`: budgets, multipliers,
        releases, the epsilon spent)."""
        return {**self.algorithm.facts(), **self.plan.summary()}


# The wrapper's class for each wrapped method's class (`DifferentiallyPrivate.wrapping`).
_WRAPPER_CLASSES: dict[tuple[type[DifferentiallyPrivate], type[AnyAlgorithm]], type[DifferentiallyPrivate]] = {}


def with_privacy(algorithm: AnyAlgorithm, fed: CellFederation | None = None) -> AnyAlgorithm:
    """`algorithm` as a cell runs it under its privacy knob: wrapped in `DifferentiallyPrivate` where the
    knob is on and the method's upload is a model or an update; itself otherwise (the knob off, a method
    that privatizes its uploads itself, `dp_upload = "self"`, or one wrapped already). `fed`: the cell's
    Federation (default: the one the algorithm was built with). Called once, where the cell's method is
    built (`pflbench.simulator.cell_method`)."""
    fed = fed if fed is not None else cast("CellFederation", algorithm.engine)
    if not would_wrap(algorithm, fed):
        return algorithm
    return DifferentiallyPrivate.wrapping(type(algorithm))(algorithm, fed)


def would_wrap(algorithm: AnyAlgorithm, fed: CellFederation) -> bool:
    """Whether `with_privacy(algorithm, fed)` wraps `algorithm`: the cell's knob is on, the method's
    upload is a model or an update, and it is not wrapped already. True for a method built by hand for
    a cell with privacy: the round driver refuses it (`pflbench.simulator.cell_method.check_cell_method`)."""
    return (
        fed.privacy is not None
        and not isinstance(algorithm, DifferentiallyPrivate)
        and algorithm.dp_upload in ("model", "update")
    )
