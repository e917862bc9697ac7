"""Scoring the newcomers: the models an algorithm serves clients it never saw, scored on their splits."""
from __future__ import annotations

import time

from pflbench.metrics import client_rows


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
