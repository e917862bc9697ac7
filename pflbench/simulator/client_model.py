"""The clients' model: one architecture called functionally on stacked client states (`ClientModel`), the
type the engine interface names (`Engine.model`)."""

from __future__ import annotations

import contextlib
import copy
import math
import threading
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from pflbench import streams

from pflbench.api_types import State
from pflbench.simulator.batching import set_conv_layout, stacked_twin


def to_channels_last(t: Tensor) -> Tensor:
    """A 4-D float tensor (a convolution's weight, a batch of images) in channels-last memory order
    (itself when it already is); anything else unchanged."""
    if t.dim() == 4 and t.is_floating_point():
        return t.to(memory_format=torch.channels_last)  # `contiguous` would keep a 1-channel tensor channels-first
    return t


def _slots_of(template: nn.Module, names: list[str]) -> dict:
    slots = {}
    for name in names:
        owner_name, _, attr = name.rpartition(".")
        owner = template.get_submodule(owner_name)
        slots[name] = (owner._parameters if attr in owner._parameters else owner._buffers, attr)
    return slots


class ClientModel:
    """One architecture, called functionally on stacked client states.

    Many clients at once run through the model's natively batched twin (`pflbench.simulator.batching`) where
    every layer has one, else through torch.func.vmap (`native=False` forces vmap).
    """

    def __init__(self, module: nn.Module, native: bool = True):
        self.template = copy.deepcopy(module).to("meta")
        # Twins for CPU (a loop of convolutions) and CUDA (grouped convolutions); None: use vmap.
        self._twins = {grouped: stacked_twin(self.template, grouped) if native else None for grouped in (False, True)}
        self.param_names = [name for name, _ in module.named_parameters()]
        self.buffer_names = [name for name, _ in module.named_buffers()]
        self.names = self.param_names + self.buffer_names
        # name -> (the owning module's parameter or buffer dict, attribute), for `bound`
        self._slots = _slots_of(self.template, self.names)
        self._thread_templates: dict[int, tuple[nn.Module, dict]] = {}  # client threads' own (`_binding`)
        # Parameters and statistics of BatchNorm layers (FedBN keeps these on the client).
        self.batchnorm_names = {
            f"{module_name}.{name}"
            for module_name, module in module.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)
            for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        }
        self.layers = self._layer_groups()
        self._module = module  # kept for initial values
        # name -> shape of every parameter and buffer of one client's model (unstacked)
        self.shapes = {name: t.shape for name, t in [*module.named_parameters(), *module.named_buffers()]}
        # Channels-last convolutions (module doc): set by the Federation for convolutional models on CPU.
        self.has_conv = any(isinstance(m, nn.Conv2d) for m in module.modules())
        self._channels_last = False
        # Layers that draw from the global random generator while training: clients trained side by
        # side would interleave their draws, so such models train their clients one after another.
        self.stochastic = any(isinstance(m, (nn.modules.dropout._DropoutNd, nn.RReLU)) for m in module.modules())
        self._compiled: dict = {}  # (trainable, SGD rule, single, device, layout) -> compiled step; None: failed
        self.compile_seconds = 0.0  # spent compiling steps of this model in this process
        self.static_steps: dict = {}  # (width, batch, ...) -> pflbench.simulator.static_step.StaticStep (its buffers, graph)

    @property
    def channels_last(self) -> bool:
        return self._channels_last

    @channels_last.setter
    def channels_last(self, on: bool) -> None:
        self._channels_last = bool(on) and self.has_conv
        for twin in self._twins.values():
            if twin is not None:
                set_conv_layout(twin, self._channels_last)

    def _layer_groups(self) -> list[list[str]]:
        """Tensor names (parameters and buffers) grouped by layer, input to output: a layer is a
        module owning parameters, in parameter order; a BatchNorm module joins the layer before it
        (it normalizes that layer's output) and buffers go with their module. Partial
        personalization (FedPer, LG-FedAvg, FedBABU, ...) splits models by these layers."""

        def owner(name: str) -> str:
            return name.rpartition(".")[0]

        bn_modules = {owner(n) for n in self.batchnorm_names}
        groups: list[list[str]] = []
        module_group: dict[str, int] = {}
        for name in self.param_names:
            module = owner(name)
            if module not in module_group:
                module_group[module] = len(groups) - 1 if module in bn_modules and groups else len(groups)
                if module_group[module] == len(groups):
                    groups.append([])
            groups[module_group[module]].append(name)
        for name in self.buffer_names:  # a buffer of a parameterless module stays with the first layer
            groups[module_group.get(owner(name), 0)].append(name)
        return groups

    def split_layers(self, last: int) -> tuple[set[str], set[str]]:
        """(names of all but the last `last` layers, names of the last `last` layers)."""
        if not 0 <= last <= len(self.layers):
            raise ValueError(f"the model has {len(self.layers)} layers; cannot split off the last {last}")
        cut = len(self.layers) - last
        return ({n for g in self.layers[:cut] for n in g}, {n for g in self.layers[cut:] for n in g})

    def init(self, num_clients: int, seed: int, device: torch.device | str = "cpu") -> State:
        """Every client starts from the same initial model, drawn from `seed`."""
        with streams.torch_global(seed, "model.init"):
            fresh = copy.deepcopy(self._module)
            for module in fresh.modules():
                if hasattr(module, "reset_parameters") and module is not fresh:
                    # torch types Module.__getattr__ as Tensor | Module; this is the layer's own method
                    module.reset_parameters()  # type: ignore[operator]
        single = {**dict(fresh.named_parameters()), **dict(fresh.named_buffers())}
        return {
            name: t.detach().to(device).unsqueeze(0).repeat(num_clients, *([1] * t.dim())) for name, t in single.items()
        }

    def forward(self, state: State, x: Tensor, train: bool) -> Tensor:
        """Logits [K, B, C] for inputs [K, B, ...]. In training mode BatchNorm buffers in `state`
        are updated in place, per client."""
        clients, batch = x.shape[:2]
        if clients == 1:  # one client: a plain call
            return self.forward_single({name: t[0] for name, t in state.items()}, x[0], train).unsqueeze(0)
        twin = self._twins[x.device.type == "cuda"]
        if twin is None:
            self.template.train(train)
            return vmap(self._call)(state, x)
        twin.train(train)
        out = functional_call(twin, state, (x.flatten(0, 1),))
        return out.view(clients, batch, *out.shape[1:])

    def forward_single(self, state: State, x: Tensor, train: bool) -> Tensor:
        """One client's unstacked state on inputs [B, ...]: logits [B, C]."""
        if self._channels_last:  # a differentiable copy per call (cheap: weights, not activations)
            state = {name: to_channels_last(t) for name, t in state.items()}
        with self.bound(state, train) as net:
            return net(x)

    @contextlib.contextmanager
    def bound(self, state: State, train: bool) -> Iterator[nn.Module]:
        """The module with one client's (unstacked) tensors in place of its own, while the block
        runs. Binding once for many steps saves functional_call's per-call swapping, a few percent
        of a small CNN's step on a CPU."""
        saved = []
        template, slots_of = self._binding()
        for name, tensor in state.items():
            slots, attr = slots_of[name]
            saved.append((slots, attr, slots[attr]))
            slots[attr] = tensor
        template.train(train)
        try:
            yield template
        finally:
            for slots, attr, original in saved:
                slots[attr] = original

    def _binding(self) -> tuple[nn.Module, dict]:
        """(template, slots) for the calling thread: client threads (`train_clients`) each bind a
        template of their own, as binding swaps the template's tensors."""
        if threading.current_thread() is threading.main_thread():
            return self.template, self._slots
        key = threading.get_ident()
        if key not in self._thread_templates:
            template = copy.deepcopy(self.template)
            self._thread_templates[key] = (template, _slots_of(template, self.names))
        return self._thread_templates[key]

    def _call(self, state: State, x: Tensor) -> Tensor:
        return functional_call(self.template, state, (x,))

    def numel(self, names: Iterable[str] | None = None) -> int:
        return sum(math.prod(self.shapes[n]) for n in (names or self.names))
