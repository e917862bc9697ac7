"""Whether a column's conclusions carry over to the same table on another dataset (the results page,
pflbench.reports.glance): for a column on another dataset than the paper's (`table1-full-cifar10-jpeg`),
the conclusions of the column of the same table, clients and scheme on the paper's own dataset
(`table1-full`, Fashion-MNIST), each checked on the cells published here.

A conclusion is what our cells there say, whatever the paper claims: for each pair of rows the paper
orders (pflbench.reports.orderings) and each protocol, which of the two is above the other when the
paired test separates them, or that it does not; and for each row whose α is shown (pFedLA,
HeurpFedLA: pflbench.reports.alpha_views), whether it collapsed to one-hot weights (every entry 0 or 1).
It *carries over* where the cells here say the same, *does not* where they say otherwise, and is *not yet
decidable* while a row it needs has no result here. The paper's direction is not part of a conclusion:
on CIFAR-10 the paper orders some pairs the other way round from Fashion-MNIST (Local above FedAvg in
Table 1).
"""

from __future__ import annotations

from pflbench.reports.cells import display_name
from pflbench.reports.glance_data import AlphaView, CarryOver, Glance, GlanceColumn
from pflbench.reports.orderings import Claim, Judgement

CARRIES, BREAKS, UNDECIDED, NOT_DECIDABLE = "carries over", "does not carry over", "not yet decidable", "not decidable"


def home_of(glance: Glance, column: GlanceColumn) -> GlanceColumn | None:
    """The column on the paper's own dataset of the same table, clients and scheme."""
    return next(
        (
            c
            for c in glance.reproduced
            if not c.other_dataset
            and c.table == column.table
            and c.column.clients == column.column.clients
            and c.scheme == column.scheme
        ),
        None,
    )


def attach_carry_over(glance: Glance) -> None:
    """Sets `home` and `carry` on every reproduced column on another dataset that has a home column."""
    for column in glance.reproduced:
        home = home_of(glance, column) if column.other_dataset else None
        if home is None:
            continue
        column.home = home.study
        column.carry = orderings_carried(home, column) + alpha_carried(home, column)


def _outcome(claim: Claim, judgement: Judgement, first: str, second: str) -> tuple[str, str]:
    """(key, text) of what a judged pair says: which is above and by how much, in points ("FedAvg above Local
    (+1.45)"), or `first` − `second` where the test does not separate them."""
    test = judgement.test
    assert test is not None
    difference = test.mean if (claim.better, claim.worse) == (first, second) else -test.mean
    if not test.separated:
        return "not separated", f"not separated ({display_name(first)} − {display_name(second)} {difference:+.2f})"
    above, below = (first, second) if difference > 0 else (second, first)
    return above, f"{display_name(above)} above {display_name(below)} ({abs(difference):+.2f})"


def orderings_carried(home: GlanceColumn, column: GlanceColumn) -> list[CarryOver]:
    out = []
    for there in home.claims:
        pair = (there.better, there.worse)
        here = next((c for c in column.claims if {c.better, c.worse} == set(pair)), None)
        conclusion = f"{display_name(pair[0])} vs {display_name(pair[1])}"
        for judged in there.judgements:
            if judged.test is None:
                continue  # no conclusion there
            key, text = _outcome(there, judged, *pair)
            mine = here.judged(judged.protocol) if here is not None else None
            if mine is None:
                out.append(CarryOver(conclusion, judged.protocol, text, "not judged here", NOT_DECIDABLE))
            elif mine.test is None:
                out.append(CarryOver(conclusion, judged.protocol, text, mine.verdict, UNDECIDED))
            else:
                assert here is not None
                key_here, text_here = _outcome(here, mine, *pair)
                out.append(
                    CarryOver(conclusion, judged.protocol, text, text_here, CARRIES if key_here == key else BREAKS)
                )
    return out


def _default_view(column: GlanceColumn, algorithm: str) -> AlphaView | None:
    """The α view of the column's own row of `algorithm` (not a variant's from another study)."""
    row = next((r for r in column.rows if r.algorithm == algorithm), None)
    if row is None or row.ours is None:
        return None
    cells = set(row.ours.hashes)
    return next((v for v in column.alpha if v.cell in cells), None)


def alpha_carried(home: GlanceColumn, column: GlanceColumn) -> list[CarryOver]:
    out = []
    for row in home.rows:
        there = _default_view(home, row.algorithm)
        if there is None:
            continue
        conclusion = f"{display_name(row.algorithm)}'s α one-hot (every entry 0 or 1)"
        text = there.collapse_text()
        here = _default_view(column, row.algorithm)
        if here is None:
            mine = next((r for r in column.rows if r.algorithm == row.algorithm), None)
            if mine is None or mine.missing:
                out.append(CarryOver(conclusion, "", text, mine.verdict() if mine else "not run", UNDECIDED))
            else:  # it ran: diverged, failed, or no α stored
                why = mine.verdict() if not mine.run else "no α stored"
                out.append(CarryOver(conclusion, "", text, why, NOT_DECIDABLE))
        else:
            same = here.collapsed == there.collapsed
            out.append(CarryOver(conclusion, "", text, here.collapse_text(), CARRIES if same else BREAKS))
    return out
