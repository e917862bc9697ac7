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
  newcomers (made from the cell's shared data: same dataset tensors, same model;
  `Federation.of_clients`), which only the evaluation touches: it asks the algorithm for the
  newcomers' models (`Algorithm.newcomer_models(serving)`, `serving` the newcomers' own
  `pflbench.serving.Serving`), fitted only on the newcomers' own train split where the method fits
  something, and scores them through the same context (`evaluate`, `adapt_locally`).
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

The package, by job: `ids` draws which clients are newcomers, `check` refuses a cell that cannot run
with them, `scoring` scores the models an algorithm serves them, `batchnorm` fits BatchNorm statistics
on a newcomer's own data (for methods whose statistics never leave the clients).
"""

from pflbench.newcomers.batchnorm import BATCHNORM_CHUNK, fit_batchnorm_statistics
from pflbench.newcomers.check import check_unseen
from pflbench.newcomers.ids import newcomer_count, newcomer_ids, seen_ids


__all__ = [
    "BATCHNORM_CHUNK",
    "check_unseen",
    "fit_batchnorm_statistics",
    "newcomer_count",
    "newcomer_ids",
    "score_newcomers",
    "seen_ids",
]


def __getattr__(name: str) -> object:
    """`score_newcomers` on first use: the scorer builds metrics tables (pandas), which the algorithms that
    import this package for its BatchNorm fitting, and a command that lists them, do not need."""
    if name == "score_newcomers":
        from pflbench.newcomers.scoring import score_newcomers

        return score_newcomers
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
