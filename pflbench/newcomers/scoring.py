"""Scoring the newcomers: the models an algorithm serves clients it never saw, scored on their splits."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pflbench.simulator.metrics import client_rows
from pflbench.serving import Serving, score

if TYPE_CHECKING:
    from pflbench.algorithm import AnyAlgorithm


def score_newcomers(algorithm: AnyAlgorithm, serving: Serving, evaluate: tuple[str, ...]) -> tuple[list[dict], float]:
    """Metrics rows of the newcomers (`serving.clients`) at round `serving.round` and the seconds spent:
    their models from the algorithm, scored as delivered and, with `serving.adapt_epochs`, after local
    adaptation (the same rule as for trained clients), every hook given the newcomers' own `serving`.
    A newcomer model that diverges leaves its scores NaN."""
    from pflbench.simulator.training import Diverged

    start = time.perf_counter()
    newcomers = serving.clients
    scores, adapted = {}, {}
    try:
        models = algorithm.newcomer_models(serving)
        scores = score(algorithm, serving, models, evaluate)
        if serving.adapt_epochs:
            adapted = score(algorithm, serving, algorithm.adapt_locally(serving, models), evaluate)
    except Diverged:
        pass  # NaN scores: the protocol summaries never select such a round
    rows = client_rows(
        serving.round,
        newcomers.client_ids,
        scores,
        adapted,
        newcomers.split_sizes("test").tolist(),
        newcomers.split_sizes("val").tolist(),
        newcomer=True,
    )  # bytes 0: never took part
    return rows, time.perf_counter() - start
