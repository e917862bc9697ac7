"""Unseen clients (newcomers): clients held out of training altogether, served a model at evaluation.

pFL-Bench's second protocol: how does a method serve a client that never took part in training?
The cell field `unseen_fraction: f` holds `round(f * clients)` clients of the partition out of
training. What was chosen where the issue left it open:

- The partition is made over all `clients` exactly as without the knob, so the seen clients' splits
  are the same as in the cell without newcomers. Which clients are newcomers is drawn once from the
  cell seed on its own stream ("newcomers", `newcomer_ids`): the same for every algorithm, and never
  from the training RNG.
- The cell's `Federation` holds only the seen clients (positions 0..S-1; `fed.client_ids[pos]` is
  the partition id). So nothing of training can see a newcomer: the sampling schedule draws among
  the seen clients (participation applies to them), FedAvg's size weights, pFedLA's per-client
  hypernetworks, FedFomo's weights all have S rows. `fed.newcomers` is a second Federation over the
  newcomers (same dataset tensors, same model), which only the evaluation touches: it asks the
  algorithm for the newcomers' models (`Algorithm.newcomer_models(rnd, fed.newcomers)`), fitted
  only on the newcomers' own train split where the method fits something.
- Batch orders are keyed by partition id, so a client's batches do not depend on which other
  clients are held out.
- Scores: metrics rows of newcomers carry `newcomer=True` (the column exists only in cells with
  newcomers, so other cells' metrics are unchanged), `client` is always the partition id, bytes are
  0 (a newcomer never took part in a round). Summaries of the trained clients ignore those rows;
  the newcomers' own summaries are the same ones with the suffix `_newcomers`
  (`final_accuracy_newcomers`, `bestval_accuracy_newcomers`, `final_accuracy_adapted_newcomers`,
  ...), the best-validation round chosen on the newcomers' own validation split, never on test.
- A newcomer's model is fitted anew at every evaluation round (where the method fits one) and
  never written back into the algorithm's state, so scoring newcomers cannot change training.
  Its seconds are counted apart (`newcomer_time_total`), not in any round's `wall_time`.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from pflbench import streams
from pflbench.metrics import client_rows



def newcomer_count(unseen_fraction: float, clients: int) -> int:
    return int(round(unseen_fraction * clients))


def newcomer_ids(unseen_fraction: float, clients: int, seed: int) -> np.ndarray:
    """Partition ids of the newcomers, sorted: drawn from the seed alone."""
    count = newcomer_count(unseen_fraction, clients)
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    rng = streams.generator(seed, "newcomers", kind="numpy")
    return np.sort(rng.choice(clients, count, replace=False)).astype(np.int64)


def seen_ids(unseen_fraction: float, clients: int, seed: int) -> np.ndarray:
    held = set(newcomer_ids(unseen_fraction, clients, seed).tolist())
    return np.array([c for c in range(clients) if c not in held], dtype=np.int64)


def check_unseen(cell) -> None:
    """ValueError (one message naming the field and what is allowed) if the cell's unseen_fraction
    cannot be run: it must hold out at least one client and keep at least one for training, and the
    algorithm must be able to serve newcomers."""
    from pflbench.algorithm import get_algorithm

    fraction, clients = cell.unseen_fraction, cell.clients
    if not fraction:
        return
    count = newcomer_count(fraction, clients)
    if count < 1:
        raise ValueError(f"unseen_fraction {fraction} of {clients} clients holds out no client "
                         f"(round({fraction} x {clients}) = 0); use at least {0.5 / clients:.3g}, or 0 for none")
    if count > clients - 1:
        raise ValueError(f"unseen_fraction {fraction} of {clients} clients holds out all {count} of them; "
                         f"at least one client must train (at most {(clients - 1.5) / clients:.3g})")
    get_algorithm(cell.algorithm).check_newcomers(cell)


def score_newcomers(algorithm, newcomers, rnd: int, evaluate: tuple[str, ...], finetune_epochs: int) -> tuple[list[dict], float]:
    """Metrics rows of the newcomers at round `rnd` and the seconds spent: their models from the
    algorithm, scored as delivered and, with `finetune_epochs`, after local adaptation (the same
    rule as for trained clients). A newcomer model that diverges leaves its scores NaN."""
    from pflbench.training import Diverged

    start = time.perf_counter()
    scores, adapted = {}, {}
    try:
        models = algorithm.newcomer_models(rnd, newcomers)
        with algorithm.serving(newcomers):  # the algorithm's own scoring and adaptation, on the newcomers
            scores = algorithm.evaluate_splits(models, evaluate)
            if finetune_epochs:
                tuned = algorithm.adapt_locally(models, rnd, finetune_epochs)
                adapted = algorithm.evaluate_splits(tuned, evaluate)
    except Diverged:
        pass  # NaN scores: the protocol summaries never select such a round
    rows = client_rows(rnd, newcomers.client_ids, scores, adapted, newcomers.split_sizes("test").tolist(),
                       newcomers.split_sizes("val").tolist(), newcomer=True)  # bytes 0: never took part
    return rows, time.perf_counter() - start


BATCHNORM_CHUNK = 256  # samples per forward pass when a newcomer's BatchNorm statistics are estimated


@torch.no_grad()
def fit_batchnorm_statistics(newcomers, state: dict) -> dict:
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
        idx = newcomers.splits["train"][k]
        with model.bound(mine, train=False) as net:
            norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
            momenta = [m.momentum for m in norms]
            for m in norms:
                m.train()
                m.momentum = None
                m.reset_running_stats()
            try:
                for part in idx.split(BATCHNORM_CHUNK):
                    net(newcomers.features[part])
            finally:
                for m, momentum in zip(norms, momenta):
                    m.momentum = momentum
    return out
