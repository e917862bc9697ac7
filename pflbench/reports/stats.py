"""Which differences are real: the statistics behind every table's tie marks, the difference view and
the ranks across a study. Pure functions of numbers (scipy.stats does the tests); what the numbers are
(which clients, which round, which protocol) is samples.py's business.

**The test: a two-sided Wilcoxon signed-rank test on paired per-client accuracies, level 0.05.**

- *Paired on clients.* Two rows of one column were scored on the same clients' test splits (every
  algorithm of a matrix sees identical splits), and clients differ far more from each other (a
  pathological client with 4 easy classes against one with 4 hard ones: 10-15 points) than methods
  differ on one client. Pairing removes the between-client spread, which is what lets a 1-point
  difference be told from noise at all; an unpaired comparison of the two means cannot.
- *Wilcoxon rather than the paired t-test.* Per-client accuracies are bounded and discrete (k/210 on
  table1-full), their differences are skewed by the odd client that collapses, and many are exactly
  zero (two methods agreeing on every test sample of a client). With 10-20 clients the t-test's
  normality cannot be checked; the signed-rank test assumes only symmetric differences and is the
  test Demšar (2006, JMLR 7) recommends for two methods over several data sets, for these reasons.
  Zero differences are split evenly between the signs (``zero_method="zsplit"``, Demšar's rule), so
  clients on which the two methods agree count as agreement, not as absent.
- *Not McNemar's test on test samples:* the store keeps per-client accuracies, not per-sample
  predictions, and the sample noise is not the only noise: which clients a split draws is too.
- *Seeds.* A seed redraws the split, the sampling and the initial weights, so a (seed, client) pair is
  one paired observation: with fewer than ``SEED_UNITS`` (6) seeds that both rows have, the test runs
  on the per-client differences of every shared seed pooled together (this treats the seeds' clients
  as independent and so understates the seed-to-seed spread: the caption says "pooled"); from 6 shared
  seeds on, on the per-seed differences of the mean over clients (the seed is then the unit, as in a
  paper's "mean ± std over seeds"; with 5 units the signed-rank test cannot reach 0.05 at all — its
  smallest two-sided p is 0.0625 — with 6 it can: 0.031). Only seeds both rows have are compared.
  A number without clients (the worst 10% of clients: they are different clients for each method)
  is tested on seeds alone, so only from 6 shared seeds on.
- *How large, beside whether:* the difference view gives the mean paired difference with one standard
  error and its t-interval at the same level (mean ± t(1 − α/2, n − 1) · s.e.), and how many clients
  went up, down, or stayed equal (equal: the same accuracy to 1e-6, i.e. the same number of correct
  test samples).
- *Several rows:* the best of a column is bold only when the test separates it from *every* other row
  (an intersection–union test, which keeps its level without a multiplicity correction: Berger 1982);
  each row the test cannot separate from the best is marked tied. The tied marks are unadjusted per
  pair, so among many rows a few may be separated from the best by chance.

**Ranks across a study** (``friedman``, ``nemenyi_cd``, ``cliques``): Demšar's (2006, §3.2.2) Friedman
test on each method's rank within each column (a block: one dataset × scheme × clients × knob
setting), and the Nemenyi critical difference CD = q_α · sqrt(k (k + 1) / (6 N)) for k methods over N
blocks, with q_α the studentized range quantile for k groups and infinite degrees of freedom divided by
√2 (scipy.stats.studentized_range). Two methods whose average ranks differ by less than CD are not
told apart; the post-hoc comparison means something only where the Friedman test rejects equal ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from scipy import stats as sps

LEVEL = 0.05  # the level of every test, tie mark and interval the reports show
SEED_UNITS = 6  # from this many shared seeds on, the seed is the unit of a paired test
EQUAL = 1e-6  # two accuracies (in [0, 1]) closer than this are equal: the same correct count
TEST_NAME = "two-sided Wilcoxon signed-rank test"


def test_text(level: float = LEVEL) -> str:
    """How the tie marks are decided, in a sentence (every accuracy table's caption carries it)."""
    return (
        f"{TEST_NAME} on paired per-client accuracies (the same clients' test splits; seeds pooled as "
        f"(seed, client) pairs, on per-seed means from {SEED_UNITS} shared seeds on), level {level:g}"
    )


def check_level(level: float) -> float:
    if not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a probability strictly between 0 and 1 (e.g. 0.05), got {level!r}")
    return float(level)


@dataclass(frozen=True)
class Sample:
    """One table entry's numbers, by seed: `clients[seed][client]` the per-client accuracy in % (empty
    for a number without clients, e.g. the worst 10%), `values[seed]` the cell's own number in %."""

    clients: Mapping[Hashable, Mapping[int, float]]
    values: Mapping[Hashable, float]


@dataclass(frozen=True)
class Paired:
    """Row a against row b on what they share. `differences`: a − b per unit (in percentage points);
    `unit`: "client" ((seed, client) pairs pooled) or "seed" (per-seed means); `up`/`down`/`equal`:
    clients (or seeds, for a number without clients) where a is above, below, level with b."""

    differences: np.ndarray
    unit: str
    seeds: tuple
    clients: int  # paired (seed, client) observations behind it (0: none, seeds only)
    up: int
    down: int
    equal: int
    p: float | None  # the test's two-sided p; None: too few units to test
    level: float = LEVEL

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return float(np.mean(self.differences))

    @property
    def se(self) -> float | None:
        """One standard error of the mean difference (None with a single unit)."""
        if self.n < 2:
            return None
        return float(np.std(self.differences, ddof=1) / math.sqrt(self.n))

    @property
    def interval(self) -> tuple[float, float] | None:
        """The t-interval of the mean difference at `level` (None with a single unit)."""
        if self.se is None:
            return None
        half = float(sps.t.ppf(1 - self.level / 2, self.n - 1)) * self.se
        return self.mean - half, self.mean + half

    @property
    def separated(self) -> bool:
        """The test tells a from b at `level`."""
        return self.p is not None and self.p < self.level

    @property
    def unit_text(self) -> str:
        if self.unit == "seed":
            return f"{self.n} seeds (per-seed means)"
        seeds = len(self.seeds)
        return f"{self.n} clients" + (f" × seeds pooled ({seeds} seeds)" if seeds > 1 else "")


EXACT_FLIPS = 13  # scipy's wilcoxon: up to 13 differences with zeros or ties, every sign flip is tried


class PairedTexts:
    """The texts of a paired test `self.test` that may be missing (None: "–"), for the records that hold one
    (reports.differences.Difference, reports.orderings.Judgement)."""

    test: Paired | None

    def mean_text(self) -> str:
        """ "+1.81 ± 0.54" (± one standard error), "+1.81" with a single unit, "–" when untested."""
        if self.test is None:
            return "–"
        se = self.test.se
        return f"{self.test.mean:+.2f}" + (f" ± {se:.2f}" if se is not None else "")

    def interval_text(self) -> str:
        interval = None if self.test is None else self.test.interval
        return "–" if interval is None else f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"

    def p_text(self) -> str:
        if self.test is None or self.test.p is None:
            return "–"
        return f"{self.test.p:.3f}" if self.test.p >= 0.001 else "< 0.001"


def signed_rank_p(differences: Sequence[float] | np.ndarray) -> float | None:
    """Two-sided p of the Wilcoxon signed-rank test of `differences` against 0 (zeros split between the
    signs); 1.0 when every difference is zero; None with fewer than 2 differences."""
    d = np.asarray(differences, dtype=float)
    if len(d) < 2:
        return None
    d = np.where(np.abs(d) < EQUAL * 100, 0.0, d)
    if not d.any():
        return 1.0
    if len(d) <= EXACT_FLIPS and (not d.all() or len(np.unique(np.abs(d))) < len(d)):
        # With zeros or ties among at most 13 differences scipy's wilcoxon runs an exact permutation
        # test over all 2^n sign flips, one flip at a time (a third of a report's build): the same
        # test with the statistic computed for every flip at once gives the same p.
        return float(
            sps.permutation_test(
                (d,), _zsplit_rank_sum, permutation_type="samples", vectorized=True, alternative="two-sided", axis=-1
            ).pvalue
        )
    return float(sps.wilcoxon(d, zero_method="zsplit", alternative="two-sided").pvalue)


def _zsplit_rank_sum(d: np.ndarray, axis: int = -1) -> np.ndarray:
    """Wilcoxon's R+ of each row of `d` with zeros split between the signs (scipy's zsplit statistic):
    the ranks of |d| (ties averaged) of the positive differences, plus half those of the zeros."""
    d = np.moveaxis(d, axis, -1)
    ranks = sps.rankdata(np.abs(d), method="average", axis=-1)
    return ((d > 0) * ranks).sum(axis=-1) + ((d == 0) * ranks).sum(axis=-1) / 2


def paired(a: Sample, b: Sample, level: float = LEVEL) -> Paired | None:
    """Row a against row b on the seeds both have (module doc); None when they share no seed, or no
    client within a shared seed."""
    seeds = tuple(sorted((s for s in a.values if s in b.values), key=str))
    if not seeds:
        return None
    with_clients = [s for s in seeds if a.clients.get(s) and b.clients.get(s) and set(a.clients[s]) & set(b.clients[s])]
    if with_clients and len(with_clients) == len(seeds):
        pairs = np.array(
            [a.clients[s][c] - b.clients[s][c] for s in seeds for c in sorted(set(a.clients[s]) & set(b.clients[s]))],
            dtype=float,
        )
        up, down = int((pairs >= EQUAL * 100).sum()), int((pairs <= -EQUAL * 100).sum())
        counts = (up, down, len(pairs) - up - down)
        if len(seeds) >= SEED_UNITS:
            units = np.array(
                [
                    np.mean([a.clients[s][c] - b.clients[s][c] for c in sorted(set(a.clients[s]) & set(b.clients[s]))])
                    for s in seeds
                ]
            )
            return Paired(units, "seed", seeds, len(pairs), *counts, signed_rank_p(units), level)
        return Paired(pairs, "client", seeds, len(pairs), *counts, signed_rank_p(pairs), level)
    units = np.array([a.values[s] - b.values[s] for s in seeds], dtype=float)
    up, down = int((units >= EQUAL * 100).sum()), int((units <= -EQUAL * 100).sum())
    p = signed_rank_p(units) if len(seeds) >= SEED_UNITS else None
    return Paired(units, "seed", seeds, 0, up, down, len(units) - up - down, p, level)


# ---- ranks across a study (Demšar 2006) ---------------------------------------------------------------


def average_ranks(scores: np.ndarray) -> np.ndarray:
    """`scores[block, method]` (higher is better) -> each method's mean rank over the blocks (1 = best;
    ties share the mean of their ranks)."""
    scores = np.asarray(scores, dtype=float)
    ranks = np.vstack([sps.rankdata(-row, method="average") for row in scores])
    return ranks.mean(axis=0)


def friedman(scores: np.ndarray) -> float | None:
    """The Friedman test's p that all methods rank equally (None with fewer than 3 methods or 2 blocks)."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or scores.shape[1] < 3 or scores.shape[0] < 2:
        return None
    if np.all(scores == scores[:, :1]):  # every block a complete tie: nothing to rank
        return 1.0
    return float(sps.friedmanchisquare(*scores.T).pvalue)


def nemenyi_cd(methods: int, blocks: int, level: float = LEVEL) -> float:
    """The Nemenyi critical difference of average ranks for `methods` methods over `blocks` blocks."""
    if methods < 2 or blocks < 1:
        raise ValueError(f"a critical difference needs at least 2 methods and 1 block, got {methods} and {blocks}")
    q = float(sps.studentized_range.ppf(1 - level, methods, np.inf)) / math.sqrt(2)
    return q * math.sqrt(methods * (methods + 1) / (6.0 * blocks))


def cliques(ranks: Sequence[float] | np.ndarray, cd: float) -> list[tuple[int, ...]]:
    """The maximal groups of methods (indices into `ranks`) whose average ranks all lie within `cd` of
    each other: the bars of a critical-difference diagram. Groups of one are left out."""
    order = sorted(range(len(ranks)), key=lambda i: ranks[i])
    groups: list[tuple[int, ...]] = []
    for start in range(len(order)):
        end = start
        while end + 1 < len(order) and ranks[order[end + 1]] - ranks[order[start]] < cd:
            end += 1
        group = tuple(order[start : end + 1])
        if len(group) > 1 and not any(set(group) <= set(g) for g in groups):
            groups.append(group)
    return groups
