"""A newcomer's BatchNorm statistics, fitted on its own train split (pflbench.newcomers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pflbench.engine import Engine


BATCHNORM_CHUNK = 256  # samples per forward pass when a newcomer's BatchNorm statistics are estimated


@torch.no_grad()
def fit_batchnorm_statistics(newcomers: Engine, state: dict) -> dict:
    """`state` [U, ...] (one model per newcomer) with every BatchNorm layer's running statistics
    estimated afresh on that newcomer's own train split: reset, then the cumulative average of the
    statistics of chunks of BATCHNORM_CHUNK samples (torch's momentum=None), one pass in sample
    order, the parameters unchanged and every other layer in eval mode (no dropout draw, no random
    stream touched). For methods whose BatchNorm statistics never leave the clients (pFedLA): a
    newcomer cannot be given the trained clients' statistics, and its own train split is what a
    client's statistics are made from. Returns new tensors; a model without BatchNorm comes back as is."""
    model = newcomers.model
    if not model.buffer_names:
        return state
    out = {n: t.clone() for n, t in state.items()}
    for k in range(newcomers.num_clients):
        mine = {n: t[k] for n, t in out.items()}  # views: the statistics land in `out`
        idx = newcomers.sample_ids(k, "train")
        with model.bound(mine, train=False) as net:
            norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
            momenta = [m.momentum for m in norms]
            for m in norms:
                m.train()
                m.momentum = None
                m.reset_running_stats()
            try:
                for part in idx.split(BATCHNORM_CHUNK):
                    net(newcomers.data(part)[0])
            finally:
                for m, momentum in zip(norms, momenta):
                    m.momentum = momentum
    return out
