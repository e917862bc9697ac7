"""The orderings the paper claims, judged under each protocol (the results page, pflbench.reports.glance).

For the pairs in `CLAIMS`, the paper's direction is read from its own numbers (a > b where the paper's a
is higher), and judged under each protocol in `JUDGED`: as delivered, after local adaptation, and *mixed*
— where the paper compares a method that delivers one global model (its card says it personalizes
"nothing": FedAvg) with personalized ones, its global-model number can only be after local adaptation
(the reference files' protocol note), while a personalized method may be scored as delivered; mixed reads
the global-model method adapted and the other as delivered. Each is the paired difference (stats.paired:
the same clients' test splits, every published seed pooled as (seed, client) pairs) with its 95%
t-interval and clients up/down; *holds* / *reversed* when the signed-rank test separates the two, *not
separated* otherwise. A chain (Local < FedAvg < pFedLA) holds when each link holds and fails when one is
reversed.

Where the choice is ours (the paper is silent): the claims judged are the ones pFedLA's text and tables
make about its baselines (`CLAIMS`), not every pair of rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from pflbench.reports.cells import card, display_name
from pflbench.reports.protocols import ADAPTED, DEFAULT, Protocol
from pflbench.reports.stats import Paired, PairedTexts, Sample, paired
from pflbench.reports.tables import Table

# The orderings judged (pFedLA, Section 4.3: pFedLA is "superior" to its baselines; FedAvg against
# Local and pFedHN against pFedLA as its tables order them). The direction of each is the paper's.
CLAIMS: tuple[tuple[str, str], ...] = (
    ("fedavg", "local"),
    ("pfedla", "local"),
    ("pfedla", "fedavg"),
    ("pfedhn", "pfedla"),
)
CHAIN = ("local", "fedavg", "pfedla")  # the paper's Table 1-2 chain, judged as a whole
MIXED = "mixed"
JUDGED = ("delivered", "adapted", MIXED)


def global_model(algorithm: str) -> bool:
    """The method delivers one global model to every client (its card: it personalizes "nothing")."""
    return card(algorithm).personalizes.lower().startswith("nothing")


@dataclass
class Judgement(PairedTexts):
    protocol: str  # delivered, adapted or mixed
    test: Paired | None
    note: str = ""  # "same as adapted" etc.
    waiting: bool = False  # a side has no number yet and its study's command plans cells for it

    @property
    def verdict(self) -> str:
        if self.test is None:
            return "not yet run" if self.waiting else "not run"
        if not self.test.separated:
            return "not separated"
        return "holds" if self.test.mean > 0 else "reversed"

    def counts_text(self) -> str:
        return "–" if self.test is None else f"{self.test.up} up / {self.test.down} down"


@dataclass
class Claim:
    better: str  # the algorithm the paper puts above
    worse: str
    paper_difference: float  # the paper's better − worse, points
    judgements: list[Judgement]

    @property
    def text(self) -> str:
        return f"{display_name(self.better)} > {display_name(self.worse)}"

    def judged(self, protocol: str) -> Judgement | None:
        return next((j for j in self.judgements if j.protocol == protocol), None)


@dataclass
class Chain:
    algorithms: tuple[str, ...]  # worst first, as the paper orders them
    links: list[Claim]

    @property
    def text(self) -> str:
        return " < ".join(display_name(a) for a in self.algorithms)

    def verdict(self, protocol: str) -> str:
        judged = [c.judged(protocol) for c in self.links]
        verdicts = [j.verdict if j is not None else "not run" for j in judged]
        if "not run" in verdicts or "not yet run" in verdicts:
            return "not yet run" if "not yet run" in verdicts else "not run"
        if "reversed" in verdicts:
            return "fails"
        return "holds" if all(v == "holds" for v in verdicts) else "not shown (a link is not separated)"


def judge_claims(
    paper_rows: pd.DataFrame,
    cells: pd.DataFrame,
    table_of: Callable[[Protocol], Table | None],
    base_row: Callable,
    entry_of: Callable,
    waiting: frozenset[str] = frozenset(),
) -> tuple[list[Claim], Chain | None]:
    """The paper's orderings (`CLAIMS`, `CHAIN`) judged on the column's cells (module doc); `waiting`: the
    algorithms whose cells the column's command plans but has no result for yet."""
    means = {str(a): float(m) for a, m in zip(paper_rows.get("algorithm", []), paper_rows.get("mean", []))}

    def sample(algorithm: str, protocol: Protocol) -> Sample | None:
        t = table_of(protocol)
        entry = entry_of(t, base_row(t, algorithm))
        return entry.sample if entry is not None and entry.mean is not None else None

    claims = []
    for a, b in CLAIMS:
        if a not in means or b not in means or means[a] == means[b]:
            continue
        better, worse = (a, b) if means[a] > means[b] else (b, a)
        judgements = []
        for name in JUDGED:
            if name == MIXED:
                if global_model(better) == global_model(worse):
                    continue  # both global or both personalized: the paper does not mix here
                first = ADAPTED if global_model(better) else DEFAULT
                second = ADAPTED if global_model(worse) else DEFAULT
            else:
                first = second = DEFAULT if name == "delivered" else ADAPTED
            x, y = sample(better, first), sample(worse, second)
            test = paired(x, y) if x is not None and y is not None else None
            late = (x is None and better in waiting) or (y is None and worse in waiting)
            judgements.append(Judgement(name, test, waiting=test is None and late))
        claims.append(Claim(better, worse, means[better] - means[worse], judgements))
    chain = None
    if all(a in means for a in CHAIN) and all(means[x] < means[y] for x, y in zip(CHAIN, CHAIN[1:])):
        links = [
            next(c for c in claims if (c.better, c.worse) == (y, x))
            for x, y in zip(CHAIN, CHAIN[1:])
            if any((c.better, c.worse) == (y, x) for c in claims)
        ]
        if len(links) == len(CHAIN) - 1:
            chain = Chain(CHAIN, links)
    return claims, chain
