"""The algorithm API: one class per method, one hook per concern (after Flower's Strategy).

A method asks the engine for what it needs through `self.engine`, the narrow engine interface
(`pflbench.engine.Engine`: train these clients from this state with this objective, evaluate, the
model's layout and initial state, the clients' sizes, named random streams, the budget); nothing else
of the engine, and not the cell's configuration, is handed to it.

A round, as the engine (`pflbench.simulator.rounds.run_round`) drives it, with `rnd` the round's context
(`pflbench.round_context.Round`: its number, the sampled clients `rnd.clients`, their share of the
local work; from `receive` on a `ClientRound`, the same round with what the server sent, `rnd.download`):

    download = alg.configure(rnd)                 # server -> each sampled client: a Payload  (bytes down)
    state    = alg.receive(rnd, download)         # client: the model it will train
    state    = alg.local_train(rnd, state)        # client: local SGD (batched across clients)
    upload   = alg.send(rnd, state)               # client -> server, keeps its local part: a Payload (bytes up)
    alg.aggregate(rnd, upload.arrived())          # server: the uploads that reached it (system.dropout)

A server that updates after each client (pFedHN, MH-pFedHN; `updates_per_client`) takes each client's
upload as it is made: `local_train` hands it over with `rnd.deliver(upload)`, and the engine calls
`alg.aggregate_client(rnd, upload)` with what arrived (privatized under the privacy knob) before the
next client trains; the round's `aggregate` then has nothing left to do.
    ... every eval_every rounds, with `serving` the evaluation's context (`pflbench.serving.Serving`:
        the clients served, the round, the adaptation epochs): alg.personalized() scored by
        alg.evaluate(serving, models, splits) on every client's own splits, after
        alg.adapt_locally(serving, models) too (the adapted protocol), and, in a cell with unseen clients,
        alg.newcomer_models(serving) for the newcomers, served through their own Serving

No hook reads what another hook left in a shared field: what a hook needs of the round comes in its
arguments (frozen), what it sends is its return value. What crosses the network is a
`pflbench.payload.Payload` (per-client tensors, stacked or one dict per client): the engine counts the
bytes of exactly these, so an algorithm's communication is whatever its hooks exchange — nothing to
declare separately. (A plugin class written in a retired form, its hooks or its attributes, is refused
when it registers with one line naming its file and the new form: pflbench.loader.retired, behind the plugin
loader.)

State for checkpoints (`pflbench.storage.checkpoint`): `state_dict()` / `load_state_dict()` capture everything
a cell needs to continue after round r, as each method declares it, in three class attributes (each
the whole tuple, a subclass extending its base's: `state = (*FedAvg.state, "personal_state")`):
`state`, the attributes rounds change that hold tensors, States, numpy arrays or plain Python values
(in any nesting of lists, tuples and dicts), saved as they are; `state_objects`, those holding an
object with its own state (an nn.Module, an optimizer, a torch or numpy random generator), saved
through it; `state_rebuilt`, those `setup()` rebuilds unchanged from the cell, not saved. Nothing is
found by walking the instance: an attribute in none of the three (other than `engine` and `hp`) is a
`StateError` naming it (`undeclared_state`), so a method that forgets one fails the registry-wide
resume test instead of resuming wrongly. Declared rather than walked, so that what a checkpoint holds
is read on the class, and a cache or a reference to the engine is never saved by accident; each
attribute the whole tuple, as `state_objects` was, so that `cls.state` is exactly what is saved (a base's
names left out are caught as undeclared).

The base class is only the hooks: `setup`, `configure`, `receive`, `send`, `aggregate` and
`personalized` are the method's to define (each raises NotImplementedError naming itself);
`local_train` (the engine's local SGD), `evaluate` and `adapt_locally` (the engine's scoring and
adaptation) have the engine's defaults; `newcomer_models` is needed only for cells with unseen
clients (a method without it is refused them before anything runs). FedAvg is one base among others
(`pflbench.fedavg.FedAvg`): a global model, each client's copy of its local part
(`is_local`), and the uploads' `weighted_mean`; FedBN, FedPer, Local, FedProx, Ditto, ... extend it,
pFedHN, pFedLA, FedMN and MH-pFedHN extend `Algorithm` directly. See `pflbench/algorithms/README.md`.

The method API is closed over itself: this module, pflbench.fedavg, card, capabilities, streams,
round_context, payload, serving, the engine's Protocol (pflbench.engine) and the types a method names
(pflbench.api_types: State, SGD, Objective, Diverged, CellResult; config, registry, algorithm_state)
import only each other (tests/test_import_cycles.py). A method whose step is not the engine's SGD on an
objective uses the second layer, the custom-step kit, which builds on the API and the engine and which
the API never imports: pflbench.kit.steps (its own batched steps on the engine's batch plan),
pflbench.kit.representation (a body and head split of the clients' model) and pflbench.kit.feature_training.
It stays a second layer rather than one engine call: FedMN, pFedMe and the representation methods each
step in their own way (routing, an inner problem, features), which one call would have to enumerate.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeAlias, cast, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import TypeVar

from pflbench import registry
from pflbench.api_types import State
from pflbench.algorithm_state import (  # how a checkpoint captures a method, importable from here as before
    PLAIN_TYPES as PLAIN_TYPES,
    StateError,
    captured_state,
    check_capturable as check_capturable,
    load_object_state as load_object_state,
    object_state as object_state,
    restore_state,
)
from pflbench.capabilities import Capabilities, Refusal, refusal
from pflbench.card import FAMILIES, Card
from pflbench.engine import Budget, Engine
from pflbench.payload import Payload
from pflbench.registry import Registry
from pflbench.round_context import ClientRound, Round
from pflbench.serving import Models, Scored, Scores, Serving

if TYPE_CHECKING:
    from pflbench.config import CellConfig


__all__ = [
    "ALGORITHMS",
    "FAMILIES",
    "Algorithm",
    "AnyAlgorithm",
    "Budget",
    "Capabilities",
    "Card",
    "ClientRound",
    "Engine",
    "Hyperparams",
    "Models",
    "Payload",
    "Refusal",
    "Round",
    "Scored",
    "Scores",
    "Serving",
    "StateError",
    "check_declared",
    "get_algorithm",
    "undeclared_state",
]


A = TypeVar("A", bound="type[AnyAlgorithm]")  # an algorithm class, as registered


class AlgorithmRegistry(Registry[type["AnyAlgorithm"]]):
    """The algorithms' registry: `register(name, card=Card(...))` sets the class's `name` and `card`
    (its own, never inherited) and settles its `capabilities`. A class written in a retired form of the
    API (presentation and capability class attributes, hooks in the old form) is refused with one line
    (pflbench.loader.retired, installed by the plugin loader); any other class is registered as it is."""

    def register(self, name: str, card: Card | None = None, **attributes: Any) -> Callable[[A], A]:
        add = super().register(name, **attributes)

        def decorator(cls: A) -> A:
            own_card, capabilities = _card_of(cls, name, card), _capabilities_of(cls, name)
            # `cls` itself, or an error where it uses a retired form (pflbench.loader.retired, installed by pflbench.loader.plugins)
            cls = registry.adapter("algorithm")(cls, own_card, capabilities)
            cls.card, cls.capabilities = own_card, capabilities
            add(cls)
            return cls

        return decorator


def _card_of(cls: type, name: str, card: Card | None) -> Card:
    if card is None and isinstance(cls.__dict__.get("card"), Card):
        card = cls.__dict__["card"]
    return (card or Card()).named(name)


def _capabilities_of(cls: type, name: str) -> Capabilities:
    """The class's own `capabilities`, else the nearest base's."""
    return next((k.__dict__["capabilities"] for k in cls.__mro__ if "capabilities" in k.__dict__), Capabilities())


ALGORITHMS: AlgorithmRegistry = AlgorithmRegistry("algorithm")


class Hyperparams(BaseModel):
    """An algorithm's own hyperparameters; subclasses declare fields with the paper's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_Hyperparams = Hyperparams  # the base class, for annotations inside Algorithm (whose `Hyperparams` is a ClassVar)
HP = TypeVar("HP", bound=Hyperparams, default=Hyperparams)  # an algorithm's own Hyperparams class
# What a method's client hooks hand each other, and the form of its models: a stacked State unless the
# method says otherwise (`Algorithm[XHP, Received, Trained, PersonalModels]`).
Received = TypeVar("Received", default=State)  # what `receive` gives `local_train`
Trained = TypeVar("Trained", default=State)  # what `local_train` gives `send`
PersonalModels = TypeVar("PersonalModels", default=Models)  # what `personalized` gives the evaluation hooks
AnyAlgorithm: TypeAlias = "Algorithm[Any, Any, Any, Any]"  # any method, as the engine and the runner hold one


class Algorithm(Generic[HP, Received, Trained, PersonalModels]):
    """A method: its hooks (module doc), generic over its hyperparameters' class, so that `self.hp` is
    typed (`class Ditto(Algorithm[DittoHP])`: `self.hp.lam` is a float); the class is also its
    `Hyperparams`, what the cell's `hp` is parsed into. The other three parameters type what the hooks
    hand each other, each a stacked `State` (`Models`, one State per group, for the models) unless the
    method says otherwise: `Received`, what `receive` returns and `local_train` takes; `Trained`, what
    `local_train` returns and `send` takes; `PersonalModels`, what `personalized` and
    `newcomer_models` return and `evaluate` and `adapt_locally` take (pFedHN:
    `Algorithm[PFedHNHP, State, Trained]`; FedMN: its module pool and routings). mypy then checks that
    a method's hooks fit together."""

    name: ClassVar[str] = ""  # the registered name (set by `ALGORITHMS.register`)
    # How reports show the method (pflbench.card): the class's own, set by `ALGORITHMS.register`.
    card: ClassVar[Card] = Card()
    # What it can run (pflbench.capabilities), inherited; a cell it cannot run is refused (`check_cell`).
    capabilities: ClassVar[Capabilities] = Capabilities()
    Hyperparams: ClassVar[type[Hyperparams]] = Hyperparams
    # Sweep ranges for Ray Tune, by hyperparameter: ("loguniform"|"uniform", low, high),
    # ("int", low, high) or ("choice", [values]).
    search_space: ClassVar[dict[str, tuple]] = {}
    # Hyperparameters that make the method small for smoke cells (the registry-wide tests): a slow method
    # names them here, so a new method needs no entry in any test.
    quick_hp: ClassVar[dict[str, Any]] = {}
    # Checkpoints (module doc): every attribute `setup()` or a hook sets, declared in one of three, each
    # the whole tuple (a subclass extends its base's: `state = (*FedAvg.state, "personal_state")`):
    # - `state`: what rounds change, tensors / States / arrays / plain values, saved as they are;
    # - `state_objects`: objects with their own state, saved through it (nn.Module / optimizer:
    #   state_dict; generators: their state), in this order (a module before the optimizer that steps it);
    # - `state_rebuilt`: what `setup()` rebuilds unchanged from the cell (a layer split, references to
    #   the engine's models), not saved.
    state: ClassVar[tuple[str, ...]] = ()
    state_objects: ClassVar[tuple[str, ...]] = ()
    state_rebuilt: ClassVar[tuple[str, ...]] = ()

    def __init__(self, engine: Engine, hp: HP):
        self.engine: Engine = engine  # what the method may ask of the engine (pflbench.engine)
        self.hp: HP = hp

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """`Algorithm[XHP]`'s XHP is the class's `Hyperparams` (unless the class declares its own)."""
        super().__init_subclass__(**kwargs)
        if "Hyperparams" in cls.__dict__:
            return
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin, args = get_origin(base), get_args(base)
            if isinstance(origin, type) and issubclass(origin, Algorithm) and args and isinstance(args[0], type):
                cls.Hyperparams = args[0]

    @classmethod
    def parse_hyperparams(cls, values: dict[str, Any]) -> _Hyperparams:
        try:
            return cls.Hyperparams(**values)
        except ValidationError as err:
            allowed = ", ".join(f"{k}={f.default!r}" for k, f in cls.Hyperparams.model_fields.items()) or "none"
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise ValueError(
                f"bad hyperparameters for algorithm {cls.name!r}: {problems} (allowed, with defaults: {allowed})"
            ) from None

    @classmethod
    def check_cell(cls, cell: CellConfig) -> None:
        """`Refusal` (a ValueError naming the cell's fields involved and the algorithms that can) before
        anything runs if this algorithm cannot run `cell`: its declared `capabilities`, unseen clients
        for a method without `newcomer_models`, then `cell_refusal`."""
        problem = refusal(cls.name, cls.capabilities, cell, ((n, c.capabilities) for n, c in ALGORITHMS.items()))
        problem = problem or _newcomers_refusal(cls, cell) or cls.cell_refusal(cell)
        if problem is not None:
            raise problem

    @classmethod
    def cell_refusal(cls, cell: CellConfig) -> Refusal | None:
        """A refusal that depends on the cell beyond the declared capabilities (default: none)."""
        return None

    # ---- state ---------------------------------------------------------------------------------
    def setup(self) -> None:
        """Create the method's server and client state from the cell (`self.engine`), and declare each
        attribute it sets (`state`, `state_objects`, `state_rebuilt`; module doc). Called once before
        the first round, and again before a checkpoint's state is loaded. The method's own (FedAvg:
        a global model and every client's copy); a method without state writes `pass`."""
        raise _undefined(self, "setup(self) -> None")

    @property
    def dp_upload(self) -> str:
        """Privacy (pflbench/simulator/privacy.py): what this algorithm uploads, for the privacy knob's wrapper
        (`DifferentiallyPrivate`): "model" (the update is upload - download), "update" (the upload already is
        an update; also each upload a server that updates after each client receives), "self" (not
        wrapped: the method privatizes its uploads itself, outside the engine interface; the form
        before `rnd.deliver`). Read-only: a method overrides it with a class attribute (`dp_upload = "update"`)
        or, where it depends on the hyperparameters, a property.
        Extra values in an upload (beside the model: control variates, prototypes, ...) are not told
        apart: every floating tensor of a client's upload (but the BatchNorm statistics kept on the
        clients) is clipped together, to one norm, and noised; under "model" each needs a downloaded
        counterpart (else ValueError). A method whose extra values must not be privatized so refuses the
        knob: `Capabilities(refused_knobs={"privacy": "why"})`."""
        return "model"

    # ---- the round's hooks (module doc; each receives the round's context `rnd`) -----------------
    def configure(self, rnd: Round) -> Payload:
        """Server, at the start of round `rnd`: what it sends each sampled client (`rnd.clients`), the
        round's download (`Payload.empty(rnd.clients)` for nothing). The method's own (FedAvg: the
        global model's shared part)."""
        raise _undefined(self, "configure(self, rnd: Round) -> Payload")

    def receive(self, rnd: ClientRound, download: Payload) -> Received:
        """Client, on receiving `download` (`configure`'s, also `rnd.download`): the state each sampled
        client trains, whatever `local_train` takes. The method's own (FedAvg: the downloaded model
        completed by the client's own local part, stacked [K, ...])."""
        raise _undefined(self, "receive(self, rnd: ClientRound, download: Payload) -> state")

    def local_train(self, rnd: ClientRound, state: Received) -> Trained:
        """Client: local training of the sampled clients from `state` (`receive`'s); returns what `send`
        takes. Train through the engine with the round itself (`self.engine.train(rnd, rnd.clients,
        state)`, `local_plans(rnd, ...)`, `pflbench.kit.steps.step_ids(engine, rnd, ...)`): a straggler's plan
        is then cut to its share of the work (`system.stragglers`). Default: the cell's local epochs of
        SGD on the cross-entropy, batched across clients (`state` a stacked State)."""
        return cast(Trained, self.engine.train(rnd, rnd.clients, cast(State, state)).state)

    def send(self, rnd: ClientRound, state: Trained) -> Payload:
        """Client, after training: keeps what stays on the client and returns the upload
        (`Payload.empty(rnd.clients)` for nothing). The method's own (FedAvg: the trained model is the
        client's; its shared part is uploaded)."""
        raise _undefined(self, "send(self, rnd: ClientRound, state) -> Payload")

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        """Server, at the end of the round: the uploads that reached it (`upload.clients`; under
        `system.dropout` some are missing, and `upload.positions` are the arrived ones' places among
        `rnd.clients`). Not called when none arrived: the server keeps its state. The method's own
        (FedAvg: the global model becomes the uploads' `weighted_mean`)."""
        raise _undefined(self, "aggregate(self, rnd: ClientRound, upload: Payload) -> None")

    @property
    def updates_per_client(self) -> bool:
        """Whether the server updates after each client (`aggregate_client`, each upload handed over with
        `rnd.deliver` in `local_train`) rather than once a round (`aggregate`). Read-only, like
        `dp_upload`: a class attribute, or a property where it depends on the hyperparameters."""
        return False

    def aggregate_client(self, rnd: ClientRound, upload: Payload) -> None:
        """Server, during the round, for a method whose server updates after each client
        (`updates_per_client`): one client's upload (`upload.clients`, one row) as it reached the server,
        before the next client trains. The engine calls it for each upload `local_train` hands over with
        `rnd.deliver(upload)`, once `system.dropout` has let it through and the privacy knob has
        privatized it. Default: such a method must say what its server does with it."""
        raise NotImplementedError(
            f"{type(self).__name__} delivers uploads during local training (rnd.deliver) but does not "
            f"define aggregate_client(self, rnd: ClientRound, upload: Payload) -> None"
        )

    # ---- evaluation's hooks (each receives the population it serves, `serving`) ---------------------
    def personalized(self) -> PersonalModels:
        """Every trained client's personalized model, as it stands after the last aggregation (called at
        every evaluation, between rounds): a State [N, ...], in a heterogeneous cell one State per group
        (rows: `engine.group_clients[g]`). The method's own (FedAvg: the global shared part with each
        client's local part)."""
        raise _undefined(self, "personalized(self) -> Models")

    def evaluate(self, serving: Serving, models: PersonalModels, splits: tuple[str, ...]) -> Scores:
        """split -> (accuracy [N], loss [N]) of `models` (`personalized`'s, `adapt_locally`'s or
        `newcomer_models`', one per client of `serving.clients`) on each client's own `splits`. Called
        at every evaluation. Default: the engine scores them, every split in one pass over each client's
        samples; override only for models the engine cannot call (e.g. FedMN's routed module pool)."""
        return serving.clients.evaluate_personalized_splits(cast(Models, models), splits)

    def adapt_locally(self, serving: Serving, models: PersonalModels) -> PersonalModels | Scored:
        """The clients' `models` after `serving.adapt_epochs` of plain local SGD on each one's own train
        split (the after-local-adaptation protocol; called at evaluations of a cell with finetune_epochs
        > 0), as new objects: nothing is written back into the algorithm's state. Models returned as
        `pflbench.serving.Scored` are taken as scored. Override only where `personalized()` is not a
        model the engine can train (e.g. FedMN's routed module pool)."""
        return cast(
            PersonalModels, serving.clients.adapt_locally(cast(Models, models), serving.round, serving.adapt_epochs)
        )

    # ---- unseen clients ----------------------------------------------------------------------------
    def newcomer_models(self, serving: Serving) -> PersonalModels:
        """The models this algorithm gives clients it has never seen (`serving.clients`, the newcomers'
        population: fit on its splits only), at evaluations of a cell with unseen clients, as new
        objects; nothing is written back. A method that does not define it is refused cells with unseen
        clients (`check_cell`), before anything runs (FedAvg's: the global model's shared part, a local
        part fitted on each newcomer's train split)."""
        raise _undefined(self, "newcomer_models(self, serving: Serving) -> Models")

    # ---- checkpoints (module doc; pflbench.storage.checkpoint) ---------------------------------------------
    def state_dict(self) -> dict:
        """What rounds changed in this instance, as its class declares it (`state`, `state_objects`),
        for a checkpoint taken between rounds. The values are the live objects (not copies): serialize
        them (torch.save) before the algorithm runs on. StateError names an attribute that is not
        declared (`undeclared_state`) or that a checkpoint cannot capture."""
        check_declared(self)
        return captured_state(self, type(self).state)

    def check_state(self) -> None:
        """StateError where this instance holds an attribute its class does not declare
        (`check_declared`); the engine calls it at the end of every round."""
        check_declared(self)

    def load_state_dict(self, state: dict) -> None:
        """Make this instance, after `setup()`, the one `state_dict()` was taken from."""
        restore_state(self, state, type(self).state)

    def artifacts(self) -> dict[str, np.ndarray]:
        """Arrays worth keeping from this round (e.g. aggregation weights); saved every eval_every rounds."""
        return {}

    def facts(self) -> dict[str, Any]:
        """Facts about how the method ran, added to the cell's summary when the cell ends (e.g. the
        privacy knob's wrapper adds its accounting, `pflbench.simulator.privacy.DifferentiallyPrivate`). Default: none."""
        return {}


def undeclared_state(algorithm: AnyAlgorithm) -> list[str]:
    """The attributes `algorithm` holds that its class declares in none of `state`, `state_objects` and
    `state_rebuilt` (`engine` and `hp` are the base class's): what a checkpoint would lose."""
    cls = type(algorithm)
    declared = {"engine", "hp", *cls.state, *cls.state_objects, *cls.state_rebuilt}
    # an instance attribute over one of the class's methods (a test's spy on a hook) is not state
    return [name for name in vars(algorithm) if name not in declared and not callable(getattr(cls, name, None))]


def check_declared(algorithm: AnyAlgorithm) -> None:
    """StateError naming the class's file and each attribute `algorithm` holds undeclared
    (`undeclared_state`): the engine calls it at the end of every round (`Algorithm.check_state`), so a
    forgotten attribute fails the cell rather than a resume."""
    undeclared = undeclared_state(algorithm)
    if undeclared:
        cls = type(algorithm)
        module = sys.modules.get(cls.__module__)
        where = getattr(module, "__file__", None) or cls.__module__
        raise StateError(
            f"{cls.__name__} ({where}) sets {', '.join(undeclared)}, declared in none of `state` (what rounds "
            f"change: tensors, arrays, plain values), `state_objects` (nn.Module, optimizer, random generator) "
            f"and `state_rebuilt` (what setup() rebuilds unchanged from the cell): declare "
            f"{'it' if len(undeclared) == 1 else 'each'} on the class, e.g. "
            f"state = (*{cls.__mro__[1].__name__}.state, {', '.join(map(repr, undeclared))})"
        )


def _undefined(algorithm: AnyAlgorithm, hook: str) -> NotImplementedError:
    """The error of a hook the base class leaves to the method (module doc)."""
    return NotImplementedError(
        f"{type(algorithm).__name__} does not define {hook}: the base class Algorithm is only the hooks; define "
        f"it, or extend a base that does (FedAvg's global model and weighted mean: "
        f"from pflbench.fedavg import FedAvg)"
    )


def _newcomers_refusal(cls: type[AnyAlgorithm], cell: CellConfig) -> Refusal | None:
    """Cells with unseen clients, for a method that gives newcomers no model (no `newcomer_models`)."""
    if not cell.unseen_fraction or cls.newcomer_models is not Algorithm.newcomer_models:
        return None
    able = ", ".join(n for n, c in ALGORITHMS.items() if c.newcomer_models is not Algorithm.newcomer_models)
    return Refusal(
        ("unseen_fraction", "algorithm"),
        f"algorithm {cls.name!r} gives clients it never saw no model (it does not define newcomer_models), so "
        f"it cannot run unseen_fraction={cell.unseen_fraction}; algorithms that can: {able or 'none'}",
    )


def get_algorithm(name: str) -> type[AnyAlgorithm]:
    """The registered algorithm `name` (the registry loads the built-ins and plugins first)."""
    return ALGORITHMS.get(name)
