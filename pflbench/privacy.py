"""Privacy heterogeneity (the cell's `privacy` knob): per-client differential privacy on the uploads,
each client with its own budget.

The mechanism is client-level local DP on the update (DP-FedAvg's Gaussian mechanism, applied by the
client before anything leaves it): the update u = upload - download (or the upload itself where it
already is an update, e.g. pFedHN's and pFedLA's deltas) is clipped to L2 norm `clip` over all its
floating-point tensors (BatchNorm statistics included: they are computed from the data too), and
N(0, (z_i * clip)^2) noise is added to every coordinate. Integer tensors (BatchNorm's step counter)
carry no data and pass unchanged. What the client keeps locally is not noised: its own data may
shape its own model freely; only what leaves it is private.

Accounting, per client: one Gaussian mechanism with sensitivity `clip` (neighbouring datasets: the
client's data present or replaced by none, i.e. its update replaced by the zero update) per upload,
composed over the rounds with Opacus's RDP accountant. No amplification by subsampling is claimed:
the server sees who uploads, and the schedule is drawn in advance from the seed, so every
participation is counted at sampling rate 1. Each client's noise multiplier z_i is calibrated from
its budget epsilon_i (at `delta`) over its number of participations in the schedule, known in advance
(`opacus.accountants.utils.get_noise_multiplier`); the epsilon reported per client is the
accountant's over the uploads that actually left it (a dropped upload, `system.dropout`, never left),
so it is at most its budget.

`epsilon` is one budget for every client, or a list of budgets: groups of clients, equal in size,
each client's group drawn once from the seed; `null` in the list is a group without DP.
Noise is drawn from generators keyed by (seed, round, client) and this module's salt: never the
training generators, the same for every algorithm.
"""
from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from pydantic import Field, ValidationError, field_validator

from pflbench.system import KnobParams, knob_problem

SALT = 0xD1F  # this module's stream of the cell's seed
ACCOUNTANT = "rdp"  # Opacus's Renyi-DP accountant (Mironov 2017; Mironov, Talwar & Zhang 2019)
# Renyi orders tried by the accountant: Opacus's defaults (1.1 .. 63) widened at both ends, because
# budgets here range from well below 1 to tens over few releases (the defaults then warn that the best
# order is at their edge, and give a looser bound).
ALPHAS = [1 + x / 100 for x in range(1, 10)] + [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) \
    + list(range(64, 1025, 16))


class PrivacyParams(KnobParams):
    """The `privacy.*` entries of a cell; privacy is on when `epsilon` is given."""

    epsilon: float | list[float | None] | None = None  # budget per client, or budgets of groups of clients
    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    clip: float = Field(1.0, gt=0.0)  # L2 norm the update is clipped to

    @field_validator("epsilon")
    @classmethod
    def _positive(cls, value):
        values = [value] if not isinstance(value, list) else value
        if isinstance(value, list) and not value:
            raise ValueError("give at least one budget")
        if any(isinstance(v, bool) or (v is not None and not (0 < v < math.inf)) for v in values):
            raise ValueError(f"budgets must be positive finite numbers (null: a group without DP), got {value!r}")
        return value


def parse_privacy(values: dict[str, Any]) -> dict[str, Any]:
    """The cell's `privacy` entries validated, keeping only those that differ from the defaults (a
    default written out gives the same cell hash as leaving it out). ValueError naming the entry."""
    allowed = ("epsilon (a positive budget, or a list of budgets for groups of clients, null = no DP), "
               "delta (default 1e-5), clip (L2 norm of the update, default 1.0)")
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


@lru_cache(maxsize=None)
def noise_multiplier(epsilon: float, delta: float, participations: int) -> float:
    """z such that `participations` Gaussian mechanisms (sampling rate 1) spend at most `epsilon`."""
    from opacus.accountants.utils import get_noise_multiplier

    return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=1.0,
                                      steps=participations, accountant=ACCOUNTANT, alphas=ALPHAS))


def epsilon_spent(z: float, releases: int, delta: float) -> float:
    """The accountant's epsilon at `delta` after `releases` Gaussian mechanisms of multiplier z."""
    if releases == 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(releases):
        accountant.step(noise_multiplier=z, sample_rate=1.0)
    return float(accountant.get_epsilon(delta, alphas=ALPHAS))


class PrivacyPlan:
    """Every client's budget and noise multiplier, the noising of uploads, and the releases so far."""

    def __init__(self, params: PrivacyParams, clients: int, schedule: np.ndarray, seed: int):
        self.params, self.seed = params, seed
        budgets = params.epsilon if isinstance(params.epsilon, list) else [params.epsilon]
        order = np.random.default_rng([seed, SALT]).permutation(clients)
        self.budget: list[float | None] = [None] * clients
        for budget, members in zip(budgets, np.array_split(order, len(budgets))):
            for c in members.tolist():
                self.budget[c] = budget
        self.participations = np.bincount(schedule.ravel(), minlength=clients)
        self.z = np.array([noise_multiplier(b, params.delta, int(n)) if b is not None and n > 0 else 0.0
                           for b, n in zip(self.budget, self.participations)])
        self.releases = np.zeros(clients, dtype=np.int64)

    @classmethod
    def from_cell(cls, cell, schedule: np.ndarray) -> "PrivacyPlan | None":
        if not cell.privacy:
            return None
        return cls(PrivacyParams(**cell.privacy), cell.clients, schedule, cell.seed)

    def _generator(self, rnd: int, client: int) -> torch.Generator:
        digest = hashlib.sha256(f"{self.seed}/{rnd}/{client}/{SALT}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))

    def privatize(self, rnd: int, client: int, update: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One client's update (unstacked tensors) clipped and noised with its own multiplier; counts
        the release. A client without DP (budget null) sends its update as it is."""
        self.releases[client] += 1
        z = float(self.z[client])
        if self.budget[client] is None:
            return update
        floats = [t for t in update.values() if t.is_floating_point()]
        norm = torch.sqrt(sum((t.double() ** 2).sum() for t in floats)) if floats else torch.zeros(())
        scale = min(1.0, self.params.clip / (float(norm) + 1e-12))
        gen = self._generator(rnd, client)
        out = {}
        for n, t in update.items():
            if not t.is_floating_point():
                out[n] = t
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(device=t.device, dtype=t.dtype)
            out[n] = t * scale + z * self.params.clip * noise
        return out

    def summary(self) -> dict:
        """Per client: the budget, the multiplier, the uploads released and the epsilon spent at delta
        (None for a client without DP); the cell's max and mean over the clients with DP."""
        delta = self.params.delta
        spent = [None if b is None else epsilon_spent(float(z), int(r), delta)
                 for b, z, r in zip(self.budget, self.z, self.releases)]
        private = [e for e in spent if e is not None]
        return {"privacy_delta": delta, "privacy_clip": self.params.clip,
                "privacy_budget": self.budget, "privacy_noise_multiplier": [float(z) for z in self.z],
                "privacy_releases": self.releases.tolist(), "privacy_epsilon": spent,
                "privacy_epsilon_max": max(private) if private else None,
                "privacy_epsilon_mean": float(np.mean(private)) if private else None}


def rows(upload, k: int) -> dict[str, torch.Tensor]:
    """Client k's part of an upload: row k of a stacked State, or item k of a list of States."""
    return upload[k] if isinstance(upload, list) else {n: t[k] for n, t in upload.items()}


def privatize_upload(plan: PrivacyPlan, mode: str, rnd: int, clients: torch.Tensor, download, upload,
                     arrived: torch.Tensor | None) -> list[dict[str, torch.Tensor]]:
    """The round's uploads as they leave the clients, one dict per client: with `mode` "model" the
    update is upload - download (tensor by tensor), with "update" the upload itself. Dropped uploads
    (`arrived` False) never leave and come back as {}."""
    out = []
    for k, c in enumerate(clients.tolist()):
        if arrived is not None and not bool(arrived[k]):
            out.append({})
            continue
        mine = rows(upload, k)
        if not mine:  # nothing leaves this client (e.g. Local): no release
            out.append({})
            continue
        if mode == "update" or plan.budget[c] is None:  # no DP: the upload leaves as it is
            out.append(plan.privatize(rnd, c, mine))
            continue
        reference = rows(download, k) if download else {}
        missing = [n for n in mine if n not in reference]
        if missing:
            raise ValueError(f"privacy: upload tensors {missing[:3]} have no downloaded counterpart, so the "
                             f"update upload - download is undefined for this algorithm")
        update = {n: t - reference[n].to(t.dtype) if t.is_floating_point() else t for n, t in mine.items()}
        noisy = plan.privatize(rnd, c, update)
        out.append({n: reference[n].to(t.dtype) + t if t.is_floating_point() else t for n, t in noisy.items()})
    return out
