"""The results page's findings (pflbench.reports.glance): at most 15 generated lines, each with where its
evidence is."""

from __future__ import annotations

from dataclasses import dataclass

from pflbench.reports.glance_data import Glance, GlanceColumn
from pflbench.reports.orderings import JUDGED, Claim, Judgement


@dataclass
class Finding:
    text: str
    link: str  # an anchor of the page ("#table1-full") or a study ("table1-full")
    study: str = ""  # the study it is about (the leaderboard links its page)


def signed_points(value: float) -> str:
    return f"{value:+.2f}"


def findings(glance: Glance, limit: int = 15) -> list[Finding]:
    """At most `limit` lines, each a generated statement and where its evidence is. A column on another
    dataset with a column of the paper's dataset beside it gets one line (its orderings and α are in
    what carries over); a variant column one line for its pFedLA orderings."""
    out: list[Finding] = []
    for column in glance.reproduced:
        papered = [r for r in column.rows if r.paper is not None]
        run = [r for r in papered if r.run]
        if column.other_dataset and column.home:
            out.append(Finding(carry_sentence(glance, column, papered), f"#carry-{column.anchor}", column.study))
            continue
        if column.other_dataset:
            out.append(
                Finding(
                    f"{column.short}: {len(run)} of {len(papered)} paper rows run; the paper's numbers "
                    f"are for {column.column.paper_dataset}, so none is compared",
                    f"#{column.anchor}",
                    column.study,
                )
            )
        else:
            counts: dict[str, int] = {}
            for row in papered:
                word = row.verdict().split(" the paper")[0].removesuffix(":")
                counts[word] = counts.get(word, 0) + 1
            order = ("within", "above", "below", "not run", "not yet run")
            parts = [f"{counts[w]} {w}" for w in order if w in counts]
            parts += [f"{n} {w}" for w, n in counts.items() if w not in order]
            deltas = [r.delta for r in column.rows if r.delta is not None]
            spread = f" (Δ {min(deltas):+.2f} to {max(deltas):+.2f})" if deltas else ""
            out.append(
                Finding(
                    f"{column.short}, {column.protocol.model} as the paper: of {len(papered)} paper rows "
                    f"{', '.join(parts)} the paper's ±{spread}; {seeds_text(column)}",
                    f"#{column.anchor}",
                    column.study,
                )
            )
        if column.chain is not None:
            out.append(Finding(chain_sentence(column), f"#claims-{column.anchor}", column.study))
        for claim in column.claims:
            if column.chain is not None and claim in column.chain.links:
                continue
            out.append(Finding(claim_sentence(column, claim), f"#claims-{column.anchor}", column.study))
    for column in glance.variants:
        chosen = [c for c in column.claims if c.better == "pfedla" and c.worse in ("fedavg", "local")]
        if chosen:
            text = "; ".join(claim_sentence(column, c).removeprefix(f"{column.short}: ") for c in chosen)
            out.append(Finding(f"{column.short}: {text}", f"#claims-{column.anchor}", column.study))
    for column in glance.reproduced:
        if column.alpha and not (column.other_dataset and column.home):
            parts = [f"{v.label} {100 * v.extreme:.0f}% (self-weight {v.self_weight:.2f})" for v in column.alpha]
            out.append(
                Finding(
                    f"{column.short}, α at round {column.alpha[0].round}: share of its entries at 0 or 1 "
                    f"(to 1e-6): " + "; ".join(parts),
                    f"#alpha-{column.anchor}",
                    column.study,
                )
            )
    return out[:limit]


def carry_sentence(glance: Glance, column: GlanceColumn, papered: list) -> str:
    """One line for a column on another dataset: its rows run, and how many of the conclusions of the
    paper's dataset's column carry over (pflbench.reports.carry_over)."""
    run = sum(r.run for r in papered)
    waiting = sum(r.missing and r.waiting for r in papered)
    text = f"{column.short}: {run} of {len(papered)} paper rows run" + (f", {waiting} not yet" if waiting else "")
    text += f" (the paper's numbers are for {column.column.paper_dataset}: none compared)"
    home = next((c.short for c in glance.columns if c.study == column.home), column.home)
    if not column.carry:
        return text + f"; no conclusion of {home} to check"
    counts: dict[str, list[str]] = {}
    for item in column.carry:
        counts.setdefault(item.verdict, []).append(item.label)
    parts = []
    for verdict in ("carries over", "does not carry over", "not yet decidable", "not decidable"):
        labels = counts.get(verdict, [])
        if labels:
            word = verdict if len(labels) == 1 else verdict.replace("carries", "carry").replace("does", "do")
            parts.append(
                f"{len(labels)} {word}"
                + (f" ({', '.join(labels)})" if verdict in ("does not carry over", "not decidable") else "")
            )
    return text + f"; of {len(column.carry)} conclusions of {home}: " + ", ".join(parts)


def seeds_text(column: GlanceColumn) -> str:
    seeds = column.seeds
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))} where published"


def _judged_text(j: Judgement) -> str:
    if j.test is None:
        return f"{j.protocol} not run"
    return f"{j.protocol} {j.mean_text()}, {j.test.up} up / {j.test.down} down"


def claim_sentence(column: GlanceColumn, claim: Claim) -> str:
    verdicts = list(dict.fromkeys(j.verdict for j in claim.judgements))
    if len(verdicts) == 1:
        head = f"{verdicts[0]} under every protocol"
    else:
        head = ", ".join(f"{j.verdict} {j.protocol}" for j in claim.judgements)
    return f"{column.short}: {claim.text} (paper {signed_points(claim.paper_difference)}) {head}: " + "; ".join(
        _judged_text(j) for j in claim.judgements
    )


def chain_sentence(column: GlanceColumn) -> str:
    chain = column.chain
    assert chain is not None
    names = [n for n in JUDGED if any(c.judged(n) is not None for c in chain.links)]
    verdicts = list(dict.fromkeys(chain.verdict(n) for n in names))
    head = (
        f"{verdicts[0]} under every protocol"
        if len(verdicts) == 1
        else ", ".join(f"{chain.verdict(n)} {n}" for n in names)
    )
    parts = []
    for name in names:
        judged = [(c, j) for c in chain.links if (j := c.judged(name)) is not None]
        # the link that decides: a reversed one, else one not separated, else the weakest
        decisive = min(
            judged,
            key=lambda cj: (
                {"reversed": 0, "not separated": 1}.get(cj[1].verdict, 2),
                cj[1].test.mean if cj[1].test is not None else 0.0,
            ),
        )
        parts.append(f"{name} {decisive[0].text} {decisive[1].mean_text()} ({decisive[1].verdict})")
    return f"{column.short}: chain {chain.text} {head}: " + "; ".join(parts)
