"""Named random streams: every random draw of a cell comes from a stream.

A stream is a name (``"batches"``, ``"schedule"``, ``"myalgo.noise"``, ...) and, where it is drawn anew
per round or per client, the round and the client. `generator` gives its torch or numpy generator from
the cell's seed; `seed` the integer behind it (to seed a module's initialization through torch's global
generator: `torch_global`). So a cell draws the same wherever and however often it runs, and two draws
that must not be correlated only need two names.

    from pflbench import streams
    gen = streams.generator(cell.seed, "myalgo.noise", round=rnd, client=c)      # torch.Generator
    rng = streams.generator(cell.seed, "myalgo.coins", kind="numpy")              # np.random.Generator
    with streams.torch_global(cell.seed, "myalgo.init"):                          # nn.Module init
        net = MyNet()

A new stream is only a name: it is derived from sha256("{seed}/{name}/{round}/{client}"). The streams
that existed before names (a salt per module, coordinated by hand) keep the derivations they had, so
that every published cell re-runs bit for bit, and each is declared once, by the code that draws it:

- the engine's own (the schedule, the partition, the default batch order, the privacy noise, ...) in
  `ENGINE`, here, a read-only mapping;
- a method's own in its module, as a `Stream` value that carries its derivation, e.g.
  ``PERSONAL_STREAM = streams.salted_batches("<method>.personal", <its old salt>)``, drawn as
  ``fed.train(..., stream=PERSONAL_STREAM)`` or ``streams.generator(seed, PERSONAL_STREAM, ...)``.

Why values and not a registry: the derivation travels with the stream to wherever it is drawn, so no
table is looked up or edited at run time (importing a module changes nothing here, and the engine
names no method), a method's streams are read where the method is read, and two methods cannot clash
through a shared table. A `Stream` without a derivation (``Stream("myalgo.noise")``) is the same as its
name. tests/test_streams.py pins the seed of every declared derivation and fails on seeding outside
this module. Batch orders use the ``"batches"`` family: ``"batches"`` is the engine's default order,
``"batches.<purpose>"`` another order of the same samples
(`pflbench.simulator.federation.Federation.local_plans(..., stream=...)`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, overload

import numpy as np
import torch


Kind = Literal["torch", "numpy"]
Entropy = int | list[int] | np.random.SeedSequence
# How a stream that existed before names turned (seed, round, client) into its generator's seed: an int
# (torch and numpy) or a list of ints / a SeedSequence (numpy only).
Derive = Callable[[int, int | None, int | None], Entropy]


@dataclass(frozen=True)
class Stream:
    """A random stream as the code that draws it declares it: its `name` and, for a stream that existed
    before names, its derivation (`entropy`, the one `kind` it is drawn as, and for a batch order its
    `salt`). Without a derivation, a Stream is its name (sha256 of seed, name, round, client)."""

    name: str
    entropy: Derive | None = None
    kind: Kind | None = None  # the one kind it is drawn as (None: either)
    salt: int | None = None  # a batch order's salt (the derivation its draws had before names)

    def __str__(self) -> str:
        return self.name


StreamLike = str | Stream


def _sha_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def need(value: int | None, what: str) -> int:
    """`value` (a round or a client) of a stream drawn per `what`; ValueError where it was not given."""
    if value is None:
        raise ValueError(f"this stream is drawn per {what}: give {what}=")
    return value


def batch_seed(salt: int, seed: int, round: int | None, client: int | None) -> int:
    """The seed of a salted batch order: sha256 over (seed, round, client, salt)."""
    return _sha_int(f"{seed}/{need(round, 'round')}/{need(client, 'client')}/{salt}")


def salted_cell(name: str, salt: int) -> Stream:
    """A numpy stream drawn once per cell: default_rng([seed, salt])."""
    return Stream(name, lambda s, r, c: [s, salt], "numpy")


def salted_round(name: str, salt: int) -> Stream:
    """A numpy stream drawn per round: default_rng([seed, round, salt])."""
    return Stream(name, lambda s, r, c: [s, need(r, "round"), salt], "numpy")


def salted_batches(name: str, salt: int) -> Stream:
    """A torch stream drawn per round and client (batch orders, noise): `batch_seed(salt, ...)`."""
    return Stream(name, lambda s, r, c: batch_seed(salt, s, r, c), "torch", salt)


def _spawned(name: str, index: int) -> Stream:
    return Stream(name, lambda s, r, c: np.random.SeedSequence(s).spawn(2)[index], "numpy")


BATCHES = salted_batches("batches", 0)  # the engine's default batch order (what `fed.train` draws without a stream)
NEWCOMER_FIT = salted_batches("batches.newcomer-fit", 0x0E3D)  # fitting a newcomer's local part
PRIVACY_NOISE = salted_batches("privacy.noise", 0xD1F)  # the privacy knob's noise (pflbench.simulator.privacy)

# The engine's streams that existed before names, by name; a method's are in its module (module doc).
ENGINE: Mapping[str, Stream] = MappingProxyType(
    {
        stream.name: stream
        for stream in (
            # once per cell (numpy)
            salted_cell("schedule", 0x5A3),  # the sampled clients of every round (Federation)
            salted_cell("newcomers", 0x0E3C),  # which clients are held out (pflbench.newcomers)
            salted_cell("system", 0x5E7),  # stragglers and dropped uploads (pflbench.simulator.system)
            salted_cell("privacy.budgets", 0xD1F),  # who gets which privacy budget (pflbench.simulator.privacy)
            salted_cell("shift.feature", 0xF5),  # pflbench.simulator.shifts
            salted_cell("shift.concept", 0xC5),
            _spawned("partition.assign", 0),  # the partition scheme's draw (pflbench.data.partitioning)
            _spawned("partition.split", 1),  # each client's train/val/test split
            # per round and client (torch): batch orders, DP noise
            BATCHES,
            NEWCOMER_FIT,
            PRIVACY_NOISE,
            # integer seeds of torch's global generator
            Stream("global", lambda s, r, c: _sha_int(f"{s}/global-rng"), "torch"),  # the cell's global generator
            Stream("model.init", lambda s, r, c: s, "torch"),  # the initial client model (ClientModel.init)
        )
    }
)


def _entropy(cell_seed: int, stream: StreamLike, round: int | None, client: int | None) -> tuple[Entropy, Kind | None]:
    if getattr(round, "number", None) is not None:  # a round's context (pflbench.round_context.Round)
        raise TypeError(f"stream {str(stream)!r}: give the round's number (rnd.number), not its context")
    declared = stream if isinstance(stream, Stream) and stream.entropy is not None else ENGINE.get(str(stream))
    if declared is not None and declared.entropy is not None:
        return declared.entropy(int(cell_seed), round, client), declared.kind
    return _sha_int(f"{int(cell_seed)}/{stream}/{round}/{client}"), None


def seed(cell_seed: int, stream: StreamLike, round: int | None = None, client: int | None = None) -> int:
    """The integer seed of `stream` (for `torch.manual_seed` or a library that takes a seed)."""
    entropy, _ = _entropy(cell_seed, stream, round, client)
    if not isinstance(entropy, int):
        raise ValueError(f"stream {str(stream)!r} is a numpy stream: use generator(..., kind='numpy')")
    return entropy


@overload
def generator(
    cell_seed: int,
    stream: StreamLike,
    round: int | None = None,
    client: int | None = None,
    *,
    kind: Literal["torch"] = "torch",
) -> torch.Generator: ...
@overload
def generator(
    cell_seed: int, stream: StreamLike, round: int | None = None, client: int | None = None, *, kind: Literal["numpy"]
) -> np.random.Generator: ...
def generator(
    cell_seed: int, stream: StreamLike, round: int | None = None, client: int | None = None, *, kind: Kind = "torch"
) -> torch.Generator | np.random.Generator:
    """A fresh generator of `stream` for the cell's seed (and `round`, `client` where the stream is
    drawn per round or per client): a CPU `torch.Generator`, or with kind="numpy" a
    `numpy.random.Generator`."""
    entropy, legacy_kind = _entropy(cell_seed, stream, round, client)
    if legacy_kind is not None and legacy_kind != kind:
        raise ValueError(f"stream {str(stream)!r} is drawn with {legacy_kind} (kind={legacy_kind!r})")
    if kind == "numpy":
        return np.random.default_rng(entropy)
    if not isinstance(entropy, int):  # a numpy-only derivation with no declared kind
        raise ValueError(f"stream {str(stream)!r} is drawn with numpy (kind='numpy')")
    return torch.Generator().manual_seed(entropy)


def seed_torch_global(cell_seed: int, stream: StreamLike, round: int | None = None, client: int | None = None) -> None:
    """Seed torch's global generator (every device's) from `stream`: for draws that read it (dropout
    layers). Inside `torch_global` or the cell's own fork of it (pflbench.simulator.rounds.cell_global_rng)."""
    torch.manual_seed(seed(cell_seed, stream, round, client))


_global_lock = threading.RLock()


@contextmanager
def torch_global(
    cell_seed: int,
    stream: StreamLike,
    round: int | None = None,
    client: int | None = None,
    devices: tuple[int, ...] = (),
) -> Iterator[None]:
    """While the block runs, torch's global generator is `stream`'s (e.g. to initialize an nn.Module);
    its state before the block (on the CPU and the CUDA `devices`) is restored after it. One block at
    a time in a process: the cells of a group run on threads of one process (pflbench.simulator.groups)."""
    with _global_lock, torch.random.fork_rng(devices=list(devices)):
        seed_torch_global(cell_seed, stream, round, client)
        yield
