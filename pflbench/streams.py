"""Named random streams: every random draw of a cell comes from a stream named here.

A stream is a name (``"batches"``, ``"schedule"``, ``"ditto.personal"``, ...) and, where it is
drawn anew per round or per client, the round and the client. `generator` gives its torch or numpy
generator from the cell's seed; `seed` the integer behind it (to seed a module's initialization
through torch's global generator: `torch_global`). So a cell draws the same wherever and however
often it runs, and two draws that must not be correlated only need two names.

    from pflbench import streams
    gen = streams.generator(cell.seed, "myalgo.noise", round=rnd, client=c)      # torch.Generator
    rng = streams.generator(cell.seed, "myalgo.coins", kind="numpy")              # np.random.Generator
    with streams.torch_global(cell.seed, "myalgo.init"):                          # nn.Module init
        net = MyNet()

A name not in `LEGACY` (every new stream: a plugin's own, say ``"myalgo.noise"``) is derived from
sha256("{seed}/{name}/{round}/{client}"). The names in `LEGACY` keep the derivations the code used
before streams had names (a salt per module, coordinated by hand), so that every published cell
re-runs bit for bit: each is written here once and nowhere else (tests/test_streams.py fails on
seeding outside this module). Batch orders use the ``"batches"`` family: ``"batches"`` is the
engine's default order, ``"batches.<purpose>"`` another order of the same samples
(`pflbench.federation.Federation.local_plans(..., stream=...)`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np
import torch

from pflbench import deprecation
from pflbench.round_context import Round, RoundNumber

Kind = Literal["torch", "numpy"]
BATCHES = "batches"  # the engine's default batch order (what `fed.train` draws without a stream)


def _sha_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@dataclass(frozen=True)
class Derivation:
    """How a legacy stream turned (seed, round, client) into a generator's seed: `entropy` gives an
    int (torch and numpy) or a list of ints / a SeedSequence (numpy only)."""

    entropy: Callable[[int, int | None, int | None], "Entropy"]
    kind: Kind | None = None  # the one kind it was drawn as (None: either)


def _salted_cell(salt: int) -> Derivation:  # numpy default_rng([seed, salt]): one draw per cell
    return Derivation(lambda s, r, c: [s, salt], "numpy")


def _salted_round(salt: int) -> Derivation:  # numpy default_rng([seed, round, salt])
    return Derivation(lambda s, r, c: [s, _need(r, "round"), salt], "numpy")


def _batch_seed(salt: int, s: int, r: int | None, c: int | None) -> int:
    return _sha_int(f"{s}/{_need(r, 'round')}/{_need(c, 'client')}/{salt}")


def _batch_order(salt: int) -> Derivation:  # torch, sha256 over (seed, round, client, salt)
    return Derivation(lambda s, r, c: _batch_seed(salt, s, r, c), "torch")


def _spawned(index: int) -> Derivation:
    return Derivation(lambda s, r, c: np.random.SeedSequence(s).spawn(2)[index], "numpy")


def _need(value: int | None, what: str) -> int:
    if value is None:
        raise ValueError(f"this stream is drawn per {what}: give {what}=")
    return value


# Batch-order salts of the streams that existed before names (the value is part of the derivation).
BATCH_SALTS = {
    "batches": 0,
    "batches.newcomer-fit": 0x0E3D,  # fitting a newcomer's local part (Algorithm.newcomer_models)
    "ditto.personal": 0xD1770,
    "apfl.personal": 0xA9F1,
    "apfl.alpha": 0xA9F2,
    "perfedavg.d-prime": 0x9EF1,
    "perfedavg.d-second": 0x9EF2,
    "perfedavg.adapt": 0x9EFA,
    "fedbabu.finetune": 0xBAB0,
    "fedrep.head": 0xFE0E,
    "fedmn.noise": 0xF3D,
    "mh-pfedhn.global": 0x6D,
    "mh-pfedhn.newcomers": 0x0E3F,
    "pfedhn.newcomers": 0x0E3E,
    "privacy.noise": 0xD1F,
}

LEGACY: dict[str, Derivation] = {
    # once per cell (numpy)
    "schedule": _salted_cell(0x5A3),  # the sampled clients of every round (Federation)
    "newcomers": _salted_cell(0x0E3C),  # which clients are held out (pflbench.newcomers)
    "system": _salted_cell(0x5E7),  # stragglers and dropped uploads (pflbench.system)
    "privacy.budgets": _salted_cell(0xD1F),  # who gets which privacy budget (pflbench.privacy)
    "shift.feature": _salted_cell(0xF5),  # pflbench.shifts
    "shift.concept": _salted_cell(0xC5),
    "partition.assign": _spawned(0),  # the partition scheme's draw (pflbench.partitioning)
    "partition.split": _spawned(1),  # each client's train/val/test split
    "l2gd.coins": _salted_cell(0x1260),
    # per round (numpy)
    "fedfomo.explore": _salted_round(0xF0F0),
    "mh-pfedhn.client-order": _salted_round(0x3E7),
    # per round and client (torch): batch orders, DP noise
    **{name: _batch_order(salt) for name, salt in BATCH_SALTS.items()},
    # integer seeds, mostly of torch's global generator (module initialization, dropout)
    "global": Derivation(lambda s, r, c: _sha_int(f"{s}/global-rng"), "torch"),  # the cell's global generator
    "model.init": Derivation(lambda s, r, c: s, "torch"),  # the initial client model (ClientModel.init)
    "fedmn.init": Derivation(lambda s, r, c: s, "torch"),
    "mh-pfedhn.init": Derivation(lambda s, r, c: s, "torch"),
    "pfedla.hypernet": Derivation(lambda s, r, c: s * 7919 + 17, "torch"),
    "pfedhn.hypernet": Derivation(lambda s, r, c: s * 7919 + 29, "torch"),
    "fedmn.dropout": Derivation(lambda s, r, c: _batch_seed(0xF3D, s, r, c) % (2**63), "torch"),
    "fedmn.adapt-dropout": Derivation(
        lambda s, r, c: s * 1_000_003 + _need(r, "round") * 1009 + _need(c, "client"), "torch"
    ),
    # FedMN's router samples once drew from the client alone (the same at every seed); seed 0 keeps those
    # draws. torch seeds its CPU generator with the low 32 bits: an odd multiplier keeps seeds apart there.
    "fedmn.router-samples": Derivation(lambda s, r, c: _need(c, "client") + s * 0x9E3779B1, "torch"),
}


Entropy = int | list[int] | np.random.SeedSequence


def _entropy(cell_seed: int, stream: str, round: int | None, client: int | None) -> tuple[Entropy, Kind | None]:
    if isinstance(round, Round):
        raise TypeError(f"stream {stream!r}: give the round's number (rnd.number), not its context")
    if isinstance(round, RoundNumber):  # an old-form hook's round number: the plain int it stands for
        round = int(round)
    legacy = LEGACY.get(stream)
    if legacy is not None:
        return legacy.entropy(int(cell_seed), round, client), legacy.kind
    return _sha_int(f"{int(cell_seed)}/{stream}/{round}/{client}"), None


def seed(cell_seed: int, stream: str, round: int | None = None, client: int | None = None) -> int:
    """The integer seed of `stream` (for `torch.manual_seed` or a library that takes a seed)."""
    entropy, _ = _entropy(cell_seed, stream, round, client)
    if not isinstance(entropy, int):
        raise ValueError(f"stream {stream!r} is a numpy stream: use generator(..., kind='numpy')")
    return entropy


@overload
def generator(
    cell_seed: int,
    stream: str,
    round: int | None = None,
    client: int | None = None,
    *,
    kind: Literal["torch"] = "torch",
) -> torch.Generator: ...
@overload
def generator(
    cell_seed: int, stream: str, round: int | None = None, client: int | None = None, *, kind: Literal["numpy"]
) -> np.random.Generator: ...
def generator(
    cell_seed: int, stream: str, round: int | None = None, client: int | None = None, *, kind: Kind = "torch"
) -> torch.Generator | np.random.Generator:
    """A fresh generator of `stream` for the cell's seed (and `round`, `client` where the stream is
    drawn per round or per client): a CPU `torch.Generator`, or with kind="numpy" a
    `numpy.random.Generator`."""
    entropy, legacy_kind = _entropy(cell_seed, stream, round, client)
    if legacy_kind is not None and legacy_kind != kind:
        raise ValueError(f"stream {stream!r} is drawn with {legacy_kind} (kind={legacy_kind!r})")
    if kind == "numpy":
        return np.random.default_rng(entropy)
    if not isinstance(entropy, int):  # a numpy-only derivation with no declared kind
        raise ValueError(f"stream {stream!r} is drawn with numpy (kind='numpy')")
    return torch.Generator().manual_seed(entropy)


def seed_torch_global(cell_seed: int, stream: str, round: int | None = None, client: int | None = None) -> None:
    """Seed torch's global generator (every device's) from `stream`: for draws that read it (dropout
    layers). Inside `torch_global` or the cell's own fork of it (pflbench.rounds.cell_global_rng)."""
    torch.manual_seed(seed(cell_seed, stream, round, client))


@contextmanager
def torch_global(
    cell_seed: int, stream: str, round: int | None = None, client: int | None = None, devices: tuple[int, ...] = ()
) -> Iterator[None]:
    """While the block runs, torch's global generator is `stream`'s (e.g. to initialize an nn.Module);
    its state before the block (on the CPU and the CUDA `devices`) is restored after it."""
    with torch.random.fork_rng(devices=list(devices)):
        seed_torch_global(cell_seed, stream, round, client)
        yield


def batch_stream(stream: str | None, salt: int | None) -> str:
    """The batch-order stream of a call that may still pass the deprecated `salt=` (one release)."""
    if salt is None:
        return BATCHES if stream is None else stream
    named = {v: k for k, v in BATCH_SALTS.items()}.get(salt)
    deprecation.warn(
        f"salt={salt:#x} is deprecated: pass stream={named or 'batches.<purpose>'!r} "
        f"(a named stream, pflbench.streams)",
        old=f"salt={salt:#x}",
        new=f"stream={named or 'batches.<purpose>'!r}",
    )
    if stream is not None and stream != BATCHES:
        raise ValueError("give stream= or the deprecated salt=, not both")
    if named is None:  # a plugin's own salt: its old derivation, under a name of its own
        name = f"batches.salt-{salt:#x}"
        LEGACY.setdefault(name, _batch_order(salt))
        return name
    return named
