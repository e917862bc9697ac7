"""Natively batched layers: one module call trains K clients' copies of a model.

Activations keep the clients folded into the batch dimension, [K*B, ...] with client k's rows in
block k, so everything that treats samples independently (activations, pooling, flatten, dropout)
runs unchanged on one large batch. Only the layers that own parameters need to know K; each is
swapped for a twin whose parameters carry a leading client dimension:

- Linear: one batched matmul (`baddbmm`) over [K, B, in].
- Conv2d: grouped convolution on CUDA (cuDNN runs it as one kernel); on CPU a loop of ordinary
  convolutions, because oneDNN's grouped-convolution backward is several times slower there.
- BatchNorm: clients moved into the channel dimension, [B, K*C, ...], so each client gets its own
  batch statistics and running buffers ([K, C] storage, updated in place).

A model with any other parameter-owning layer is not natively batchable; the engine then falls back
to torch.func.vmap, which batches anything (more slowly on CPU).
"""

from __future__ import annotations

import copy
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class StackedLinear(nn.Module):
    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.out_features = layer.out_features
        self.weight = layer.weight  # placeholders: real (stacked) values come via functional_call
        self.bias = layer.bias

    def forward(self, x: Tensor) -> Tensor:
        clients = self.weight.shape[0]
        grouped = x.reshape(clients, -1, x.shape[-1])
        if self.bias is None:
            out = torch.bmm(grouped, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), grouped, self.weight.transpose(1, 2))
        return out.reshape(*x.shape[:-1], self.out_features)


class StackedConv2d(nn.Module):
    def __init__(self, layer: nn.Conv2d, grouped: bool):
        super().__init__()
        self.weight, self.bias = layer.weight, layer.bias
        self.stride, self.padding, self.dilation, self.groups = (
            layer.stride,
            layer.padding,
            layer.dilation,
            layer.groups,
        )
        self.grouped = grouped
        self.channels_last = False  # the per-client loop's weights in channels-last order (set_conv_layout)

    def forward(self, x: Tensor) -> Tensor:
        clients = self.weight.shape[0]
        if not self.grouped:
            biases = self.bias if self.bias is not None else [None] * clients
            layout = (lambda w: w.to(memory_format=torch.channels_last)) if self.channels_last else (lambda w: w)
            return torch.cat(
                [
                    F.conv2d(part, layout(w), b, self.stride, self.padding, self.dilation, self.groups)
                    for part, w, b in zip(x.chunk(clients), self.weight, biases)
                ]
            )
        batch = x.shape[0] // clients
        folded = x.view(clients, batch, *x.shape[1:]).transpose(0, 1).reshape(batch, -1, *x.shape[2:])
        weight = self.weight.reshape(-1, *self.weight.shape[2:])
        bias = None if self.bias is None else self.bias.reshape(-1)
        out = F.conv2d(folded, weight, bias, self.stride, self.padding, self.dilation, self.groups * clients)
        out = out.view(batch, clients, -1, *out.shape[2:]).transpose(0, 1)
        return out.reshape(clients * batch, *out.shape[2:])


class StackedBatchNorm(nn.Module):
    def __init__(self, layer: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        self.weight, self.bias = layer.weight, layer.bias
        self.running_mean, self.running_var = layer.running_mean, layer.running_var
        self.num_batches_tracked = layer.num_batches_tracked
        # a twin is made only for a layer with a momentum (_twin_layer), so never None here
        self.momentum, self.eps = cast(float, layer.momentum), layer.eps
        self.track_running_stats = layer.track_running_stats

    def forward(self, x: Tensor) -> Tensor:
        stacked = self.weight if self.weight is not None else self.running_mean
        clients = stacked.shape[0]
        batch = x.shape[0] // clients
        folded = x.view(clients, batch, *x.shape[1:]).transpose(0, 1).reshape(batch, -1, *x.shape[2:])
        use_batch_stats = self.training or not self.track_running_stats
        updates = self.training and self.track_running_stats
        if updates:
            assert self.num_batches_tracked is not None  # tracked running stats: the layer has the counter
            self.num_batches_tracked.add_(1)
        # Updated in place when training: a view of the stacked buffers. Read only otherwise, where the
        # stacked state may be a broadcast (a global model `expand`ed over the clients): a copy serves.
        flat = (lambda t: t.view(-1)) if updates else (lambda t: t.reshape(-1))
        out = F.batch_norm(
            folded,
            None if self.running_mean is None else flat(self.running_mean),
            None if self.running_var is None else flat(self.running_var),
            None if self.weight is None else self.weight.reshape(-1),
            None if self.bias is None else self.bias.reshape(-1),
            use_batch_stats,
            self.momentum,
            self.eps,
        )
        out = out.view(batch, clients, *x.shape[1:]).transpose(0, 1)
        return out.reshape(x.shape)


def set_conv_layout(twin: nn.Module, channels_last: bool) -> None:
    """Make the per-client convolution loops of `twin` run in channels-last order (or not)."""
    for layer in twin.modules():
        if isinstance(layer, StackedConv2d):
            layer.channels_last = channels_last


def stacked_twin(module: nn.Module, grouped_conv: bool) -> nn.Module | None:
    """A copy of `module` whose parameter-owning layers take stacked parameters, or None if some
    layer has no batched twin (the caller then uses vmap)."""
    twin = copy.deepcopy(module)
    for name, child in list(twin.named_modules()):
        replacement = _twin_layer(child, grouped_conv)
        if replacement is None:
            owns_state = any(True for _ in child.parameters(recurse=False)) or any(
                True for _ in child.buffers(recurse=False)
            )
            if owns_state:
                return None
            continue
        if name == "":
            return None  # the model itself is a bare layer: nothing to fold around it
        parent_name, _, attribute = name.rpartition(".")
        setattr(twin.get_submodule(parent_name), attribute, replacement)
    return twin


def _twin_layer(layer: nn.Module, grouped_conv: bool) -> nn.Module | None:
    if type(layer) is nn.Linear:
        return StackedLinear(layer)
    if type(layer) is nn.Conv2d and layer.padding_mode == "zeros":
        return StackedConv2d(layer, grouped_conv)
    if type(layer) in (nn.BatchNorm1d, nn.BatchNorm2d) and layer.momentum is not None:
        return StackedBatchNorm(cast(nn.modules.batchnorm._BatchNorm, layer))  # its type was just checked
    return None
