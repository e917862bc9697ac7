"""The clients' model as a representation and a linear head, for methods that work on features.

Many methods since 2021 treat the model as a body phi (everything but the last layer), whose output is
the representation z = phi(x), and a linear head h(z): they add heads beside it (FedRoD's personal head,
FedDBE's and GPFL's feature-space modules), align or pool the representation (FedPAC's prototypes,
kNN-Per's datastore). `Split` gives them, for any architecture whose last layer is an `nn.Linear` called
last in its forward (every built-in model), the body as a module of its own and a way to build a
composite model around it that the engine trains like the clients' own (`Engine.train(model=...)`:
batched across clients, looped, grouped), with the tensors renamed between the two (`to_composite`,
`from_composite`), so a method keeps its state in the clients' names.

    split = Split.of(engine.model)
    composite = split.composite(lambda body, head: MyNet(body, head))   # MyNet has .body and .head
    trained = engine.train(rnd, clients, split.to_composite(state) | extra, model=composite, ...).state
    state = split.from_composite(trained)                               # the clients' names again

The modules built here live on the meta device, as every `ClientModel`'s template does: the values are
always the states the engine passes in.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import State

BODY, HEAD = "body", "head"  # the composite's attribute names for the body and the model's own head


@dataclass(frozen=True)
class Split:
    """The clients' architecture `model` as body and head: `head` is the module name of its last layer
    (an nn.Linear of `features` inputs and `classes` outputs), `head_names` its tensors, `body_names` the
    rest (BatchNorm statistics included), in the model's order."""

    model: ClientModel
    head: str
    head_names: tuple[str, ...]
    body_names: tuple[str, ...]
    features: int
    classes: int

    @classmethod
    def of(cls, model: ClientModel) -> Split:
        """`model` split before its last layer; ValueError where that layer is not a linear head."""
        _, last = model.split_layers(1)
        owners = {name.rpartition(".")[0] for name in last}
        layer = model.template.get_submodule(next(iter(owners))) if len(owners) == 1 else None
        if not isinstance(layer, nn.Linear):
            raise ValueError(
                f"this method needs a model whose last layer is one linear classifier (nn.Linear), got "
                f"{sorted(last)}; use a model such as cnn, cnn-bn, mlp or a resnet"
            )
        head = next(iter(owners))
        return cls(
            model=model,
            head=head,
            head_names=tuple(n for n in model.names if n in last),
            body_names=tuple(n for n in model.names if n not in last),
            features=layer.in_features,
            classes=layer.out_features,
        )

    def body(self) -> nn.Module:
        """A copy of the model whose head is an identity: its output is the representation [B, features]."""
        body = copy.deepcopy(self.model.template)
        parent, _, attribute = self.head.rpartition(".")
        setattr(body.get_submodule(parent) if parent else body, attribute, nn.Identity())
        return body

    def head_module(self) -> nn.Linear:
        """A copy of the model's head (an nn.Linear, on the meta device)."""
        return copy.deepcopy(self.model.template.get_submodule(self.head))  # type: ignore[return-value]

    def composite(self, build: Callable[[nn.Module, nn.Linear], nn.Module]) -> ClientModel:
        """The ClientModel of `build(body, head)`, a module that keeps them as its attributes `body` and
        `head` (and may add modules of its own), laid out as the clients' model is (channels-last)."""
        module = build(self.body(), self.head_module())
        if getattr(module, BODY, None) is None or getattr(module, HEAD, None) is None:
            raise ValueError("a composite model keeps the body and the head as its attributes `body` and `head`")
        composite = ClientModel(module)
        composite.channels_last = self.model.channels_last
        return composite

    def features_model(self) -> ClientModel:
        """The body alone as a ClientModel (its output: the representation), called with `body_state`."""
        composite = ClientModel(self.body())
        composite.channels_last = self.model.channels_last
        return composite

    def head_key(self, name: str) -> str:
        """The head's tensor `name` without the head's module name ("fc3.weight" -> "weight")."""
        return name[len(self.head) + 1 :]

    def composite_name(self, name: str) -> str:
        """The composite's name of the clients' tensor `name`."""
        if name in self.head_names:
            return f"{HEAD}.{self.head_key(name)}"
        return f"{BODY}.{name}"

    def to_composite(self, state: State) -> State:
        """`state` in the clients' names -> the same tensors in the composite's names (`body.`, `head.`)."""
        return {self.composite_name(n): t for n, t in state.items()}

    def from_composite(self, state: State) -> State:
        """The body and head tensors of a composite's `state`, in the clients' names (other modules' left out)."""
        names = {self.composite_name(n): n for n in self.model.names}
        return {names[k]: t for k, t in state.items() if k in names}

    def body_state(self, state: State) -> State:
        """The body's tensors of `state` (clients' names), as the `features_model` names them."""
        return {n: state[n] for n in self.body_names}
