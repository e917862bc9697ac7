"""The numbers the documentation's prose keeps about published cells, recomputed from results/published/.

Where a page states a number about a published cell in a sentence (rather than linking the results page,
which is generated from the stores), the number is written once, and the check here recomputes it from the
stored per-client metrics or aggregation weights with the reports' own readers and paired test
(pflbench.reports.stats) and fails if the prose drifts. The two paper-scale columns' tables are the output
of benchmarks/analysis/column_table.py, compared line by line. Each check is also shown failing on a planted
change of the page.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published"
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "benchmarks" / "analysis"))

from alpha import exact_share, load_alphas  # noqa: E402
from versus_local import last_round_clients  # noqa: E402

from pflbench.reports.stats import Paired, Sample, paired  # noqa: E402

DELIVERED, ADAPTED = "accuracy", "accuracy_adapted"


def cells_of(store: str, algorithm: str, partition: str | None = None, **hp) -> dict[int, Path]:
    """{seed: cell folder} of a published store's cells of one algorithm (on one partition scheme) whose
    hyperparameters include `hp`."""
    found: dict[int, Path] = {}
    for config in sorted((PUBLISHED / store).glob("*/config.json")):
        cell = json.loads(config.read_text())["cell"]
        if cell["algorithm"] != algorithm or not (config.parent / "summary.json").exists():
            continue
        if partition is not None and cell["partition"] != partition:
            continue
        if all(cell.get("hp", {}).get(k) == v for k, v in hp.items()):
            assert cell["seed"] not in found, f"{store}: two {algorithm} cells at seed {cell['seed']} match {hp}"
            found[cell["seed"]] = config.parent
    return found


def sample(folders: dict[int, Path], column: str) -> Sample:
    per_seed = {seed: last_round_clients(folder, column) for seed, folder in folders.items()}
    return Sample(per_seed, {seed: float(np.mean(list(v.values()))) for seed, v in per_seed.items()})


def difference(a: dict[int, Path], b: dict[int, Path], column: str) -> Paired:
    result = paired(sample(a, column), sample(b, column))
    assert result is not None
    return result


def page(relative: str) -> str:
    return (DOCS / relative).read_text()


def said(text: str, phrase: str, where: str) -> list[str]:
    """The phrase as the page must say it, whitespace-insensitive (the prose is wrapped)."""
    flat = " ".join(text.split())
    return [] if " ".join(phrase.split()) in flat else [f"{where}: does not say {phrase!r}"]


def pm(p: Paired) -> str:
    """A paired difference as the pages write it: −1.60 ± 0.35 (a true minus sign)."""
    return f"{p.mean:+.2f} ± {p.se:.2f}".replace("-", "−")


# ---- the checks: each returns the problems it finds in a page's text -----------------------------------


def chain_problems(text: str) -> list[str]:
    """docs/reproduction/index.md: Table 1's chain Local < FedAvg < pFedLA, over both seeds."""
    stores = ("table1-full", "table1-full-seed1")
    local, fedavg, pfedla = (
        {**cells_of(stores[0], a), **cells_of(stores[1], a)} for a in ("local", "fedavg", "pfedla")
    )
    assert len(local) == len(fedavg) == len(pfedla) == 2
    adapted = difference(pfedla, fedavg, ADAPTED)
    delivered = difference(fedavg, local, DELIVERED)
    problems = said(
        text,
        f"pFedLA − FedAvg is {pm(adapted)} points per client ({adapted.up} clients up, "
        f"{adapted.down} down, over both seeds)",
        "index.md",
    )
    problems += said(text, f"FedAvg − Local is {pm(delivered)} (all {delivered.clients} clients down)", "index.md")
    if not (
        delivered.down == delivered.clients
        and adapted.separated
        and delivered.separated
        and difference(fedavg, local, ADAPTED).mean > 0
    ):
        problems.append(
            "index.md: the chain's verdicts changed (FedAvg above Local adapted, below it delivered, "
            "pFedLA below FedAvg adapted, each separated)"
        )
    t2 = {a: cells_of("table2-full", a) for a in ("local", "fedavg", "pfedla")}
    for column in (DELIVERED, ADAPTED):
        if not (
            difference(t2["fedavg"], t2["local"], column).mean > 0 > difference(t2["pfedla"], t2["fedavg"], column).mean
        ):
            problems.append(
                f"index.md: Table 2's FedAvg > Local > ... > pFedLA below FedAvg no longer holds ({column})"
            )
    return problems


def samples_175_problems(text: str) -> list[str]:
    """docs/reproduction/table1-fmnist.md: pFedLA − FedAvg at 175 samples a client, by protocol."""
    pfedla, fedavg = cells_of("table1-full-175", "pfedla"), cells_of("table1-full-175", "fedavg")
    adapted, delivered = difference(pfedla, fedavg, ADAPTED), difference(pfedla, fedavg, DELIVERED)
    return said(
        text, f"(pFedLA − FedAvg {pm(adapted)}, {adapted.up} clients up, {adapted.down} down)", "table1-fmnist.md"
    ) + said(text, f"({pm(delivered)}, {delivered.up} of {delivered.clients} clients up)", "table1-fmnist.md")


T1_SEED1_ROWS = {  # docs/reproduction/table1-fmnist.md's variant table: seed-1 row -> (algorithm, store)
    "FedAvg (`table1-full-seed1`)": ("fedavg", "table1-full-seed1"),
    "pFedLA (`table1-full-seed1`)": ("pfedla", "table1-full-seed1"),
    "pFedHN, official inner optimizer (`table1-full-seed1-pfedhn-official`)": (
        "pfedhn",
        "table1-full-seed1-pfedhn-official",
    ),
}


def table1_seed1_problems(text: str) -> list[str]:
    """docs/reproduction/table1-fmnist.md: each seed-1 cell against Local at seed 1 (the variant table), and the
    paired test's p of FedAvg − Local adapted at seed 1 and over both seeds, and of pFedLA − Local over both."""
    problems = []
    local = cells_of("table1-full-seed1", "local")
    for label, (algorithm, store) in T1_SEED1_ROWS.items():
        mine = cells_of(store, algorithm)
        cells = [versus(difference(mine, local, column)) for column in (DELIVERED, ADAPTED)]
        problems += said(text, f"| {label} | 1 | {cells[0]} | {cells[1]} |", "table1-fmnist.md")
    both = {
        a: {**cells_of("table1-full", a), **cells_of("table1-full-seed1", a)} for a in ("local", "fedavg", "pfedla")
    }
    seed1 = difference(cells_of("table1-full-seed1", "fedavg"), local, ADAPTED)
    pooled = difference(both["fedavg"], both["local"], ADAPTED)
    pfedla = difference(both["pfedla"], both["local"], ADAPTED)
    problems += said(text, f"not separated on its own (p {seed1.p:.3f})", "table1-fmnist.md")
    problems += said(text, f"(the column's table; p {pooled.p:.3f})", "table1-fmnist.md")
    problems += said(text, f"over both seeds not separated from it (p {pfedla.p:.2f})", "table1-fmnist.md")
    if seed1.separated or not pooled.separated or pfedla.separated:
        problems.append("table1-fmnist.md: the second seed's verdicts changed")
    return problems


def table1_problems(text: str) -> list[str]:
    return samples_175_problems(text) + table1_seed1_problems(text)


def learned_vs_fixed_problems(text: str) -> list[str]:
    """docs/reproduction/table2-fmnist.md: learned α (logits within 2) against the fixed shared-classes rule on
    Table 2's split: not separated under either protocol, and the 95% intervals' upper end the prose gives."""
    store = "table1-2-full-pfedla-alive"
    learned = cells_of(store, "pfedla", "dominant", alpha_rule="learned")
    fixed = cells_of(store, "pfedla", "dominant", alpha_rule="shared_classes")
    diffs = [difference(learned, fixed, column) for column in (DELIVERED, ADAPTED)]
    problems = [f"table2-fmnist.md: learned − fixed is separated ({p.mean:+.2f})" for p in diffs if p.separated]
    top = max(p.interval[1] for p in diffs if p.interval is not None)
    return problems + said(text, f"intervals reach +{top:.1f} points", "table2-fmnist.md")


T2_LOCAL = ("table2-full", "table2-full-seed1", "table2-full-seed2")
T2_SEED_ROWS = {  # docs/reproduction/table2-fmnist.md's table of each seed against Local: row -> (algorithm, stores by seed)
    "FedAvg": ("fedavg", T2_LOCAL),
    "Per-FedAvg": ("perfedavg", T2_LOCAL),
    "pFedHN (official optimizer)": (
        "pfedhn",
        ("table2-full-pfedhn-official", "table2-full-seed1-pfedhn-official", "table2-full-seed2-pfedhn-official"),
    ),
    "pFedLA": ("pfedla", T2_LOCAL),
}


def versus(p: Paired) -> str:
    """A paired difference as the column tables write it: +5.57 ± 1.13 (10 up, 0 down)."""
    return f"{pm(p)} ({p.up} up, {p.down} down)"


def table2_seeds_problems(text: str) -> list[str]:
    """docs/reproduction/table2-fmnist.md's seeds: each row against Local at each seed (its table), Per-FedAvg
    against FedAvg at seed 1, and the share of pFedLA's α entries exactly 0 or 1 at seeds 1 and 2."""
    problems = []
    for label, (algorithm, stores) in T2_SEED_ROWS.items():
        for seed, (store, local_store) in enumerate(zip(stores, T2_LOCAL)):
            mine, local = cells_of(store, algorithm)[seed], cells_of(local_store, "local")[seed]
            cells = [versus(difference({seed: mine}, {seed: local}, column)) for column in (DELIVERED, ADAPTED)]
            problems += said(text, f"| {label} | {seed} | {cells[0]} | {cells[1]} |", "table2-fmnist.md")
    perfedavg, fedavg = cells_of("table2-full-seed1", "perfedavg"), cells_of("table2-full-seed1", "fedavg")
    delivered, adapted = (difference(perfedavg, fedavg, column) for column in (DELIVERED, ADAPTED))
    problems += said(
        text, f"{pm(delivered)} as delivered and {pm(adapted)} adapted (the paper has Per-FedAvg", "table2-fmnist.md"
    )
    shares = []
    for store in ("table2-full-seed1", "table2-full-seed2"):
        (folder,) = cells_of(store, "pfedla").values()
        alphas, _ = load_alphas(folder)
        at = {100 * exact_share(alphas[r]) for r in (100, 600)}
        assert len({round(s, 1) for s in at}) == 1, f"{store}: the shares at rounds 100 and 600 differ: {at}"
        shares.append(at.pop())
    problems += said(
        text,
        f"α is exactly 0 or 1 in {shares[0]:.1f}% (seed 1) and {shares[1]:.1f}% (seed 2) of its "
        "entries at rounds 100 and 600",
        "table2-fmnist.md",
    )
    return problems


def table2_alive_problems(text: str) -> list[str]:
    """docs/reproduction/table2-fmnist.md: pFedLA with logits within 2 on Table 2's split against the default server,
    against FedAvg, and learned against the fixed shared-classes rule (both protocols)."""
    store = "table1-2-full-pfedla-alive"
    alive = cells_of(store, "pfedla", "dominant", alpha_rule="learned")
    fixed = cells_of(store, "pfedla", "dominant", alpha_rule="shared_classes")
    default, fedavg = cells_of("table2-full", "pfedla"), cells_of("table2-full", "fedavg")
    d = {
        (name, column): difference(alive, other, column)
        for name, other in (("default", default), ("fedavg", fedavg), ("fixed", fixed))
        for column in (DELIVERED, ADAPTED)
    }
    return (
        said(
            text,
            f"give {pm(d['default', DELIVERED])} as delivered and {pm(d['default', ADAPTED])} adapted "
            f"({d['default', DELIVERED].up} and {d['default', ADAPTED].up} clients up)",
            "table2-fmnist.md",
        )
        + said(
            text,
            f"does not: {pm(d['fedavg', ADAPTED])} adapted, and {pm(d['fedavg', DELIVERED])} against "
            "FedAvg's global model as delivered",
            "table2-fmnist.md",
        )
        + said(
            text,
            f"fixed reference ({pm(d['fixed', DELIVERED])} delivered, {pm(d['fixed', ADAPTED])} adapted)",
            "table2-fmnist.md",
        )
    )


def table2_local_175_problems(text: str) -> list[str]:
    """table2-fmnist.md: Local at 175 samples (`table2-full-175-local`): at dominant share 0.3 its mean client test
    accuracy at rounds 100 / 200 / 600 and its Δ to the paper's 65.60; at share 0.45 its round-600 mean and Δ."""
    from curve import mean_curve

    by_share = {
        json.loads((f / "config.json").read_text())["cell"]["partition_params"]["dominant_share"]: f
        for f in (PUBLISHED / "table2-full-175-local").glob("*/")
        if (f / "summary.json").exists()
    }
    curve, adapted = mean_curve(by_share[0.3], DELIVERED), mean_curve(by_share[0.3], ADAPTED)
    phrase = (
        f"{curve[100]:.2f} at round 100, {curve[200]:.2f} at round 200, {curve[600]:.2f} at round 600, as delivered "
        f"and adapted (Δ {curve[600] - 65.60:+.2f} to the paper's 65.60"
    )
    problems = said(text, phrase, "table2-fmnist.md")
    milder = mean_curve(by_share[0.45], DELIVERED)
    problems += said(text, f"at {milder[600]:.2f} at round 600 (Δ {milder[600] - 65.60:+.2f})", "table2-fmnist.md")
    if abs(adapted[600] - curve[600]) >= 0.005:
        problems.append(f"table2-fmnist.md: Local 175 / 0.3 adapted ends at {adapted[600]:.2f}, not as delivered")
    return problems


def table2_problems(text: str) -> list[str]:
    return (
        learned_vs_fixed_problems(text)
        + table2_seeds_problems(text)
        + table2_alive_problems(text)
        + table2_local_175_problems(text)
    )


ALIVE_ROWS = {  # docs/algorithms/pfedla.md's validation table: row label -> the cell's settings
    "default: ReLU heads, Adam 1e-2": dict(alpha_rule="learned", head="relu", hn_lr=0.01, logit_bound=0.0),
    "ReLU heads, Adam 1e-3": dict(alpha_rule="learned", head="relu", hn_lr=0.001),
    "softmax heads, logits within 4": dict(head="softmax", logit_bound=4.0),
    "softmax heads, logits within 2": dict(head="softmax", logit_bound=2.0),
    "fixed shared-classes reference (not learned)": dict(alpha_rule="shared_classes"),
}


def alive_table_problems(text: str) -> list[str]:
    """docs/algorithms/pfedla.md: the share of α entries exactly 0 or 1 at rounds 10 / 50 / 100 / 200 of each
    candidate in `table1-pfedla-alive`, as the validation table prints it."""
    problems = []
    for label, hp in ALIVE_ROWS.items():
        row = re.search(rf"^\| {re.escape(label)} \| ([^|]*)\|", text, flags=re.M)
        if row is None:
            problems.append(f"pfedla.md: no row {label!r}")
            continue
        (folder,) = cells_of("table1-pfedla-alive", "pfedla", **hp).values()
        alphas, _ = load_alphas(folder)
        shares = [100 * exact_share(alphas[r]) for r in (10, 50, 100, 200)]
        printed = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", row.group(1).split("%")[0])]
        if len(printed) != 4 or any(abs(a - b) > 0.05 for a, b in zip(printed, shares)):
            problems.append(f"pfedla.md: {label}: the page says {printed}, the store {[round(s, 1) for s in shares]}")
    return problems


GPU_ROWS = ("local", "fedavg", "pfedla", "heurpfedla")


GPU_LABELS = {"local": "Local", "fedavg": "FedAvg", "pfedla": "pFedLA", "heurpfedla": "HeurpFedLA"}


def gpu_table_problems(text: str) -> list[str]:
    """docs/measurements/gpu.md's table, row by row: the CPU and GPU cells' final means, GPU − CPU per client, the
    largest gap of the per-round client means (either protocol), seed 1 − seed 0 on the CPU, and the wall times."""
    from pflbench.reports.cells import read_metrics

    def mean(folder: Path, column: str) -> float:
        return float(np.mean(list(last_round_clients(folder, column).values())))

    problems = []
    for algorithm in GPU_ROWS:
        (gpu,) = cells_of("table1-full-gpu", algorithm).values()
        cpu = PUBLISHED / "table1-full" / gpu.name
        cells = []
        for column in (DELIVERED, ADAPTED):
            cells.append(f"{mean(cpu, column):.2f} / {mean(gpu, column):.2f}")
            cells.append(pm(difference({0: gpu}, {0: cpu}, column)))
        curves = [read_metrics(f).groupby("round")[[DELIVERED, ADAPTED]].mean() * 100 for f in (gpu, cpu)]
        cells.append(f"{float((curves[0] - curves[1]).abs().max().max()):.2f}")
        seed1 = cells_of("table1-full-seed1", algorithm)
        cells.append(
            "–"
            if not seed1
            else " / ".join(
                f"{mean(seed1[1], column) - mean(cpu, column):+.2f}".replace("-", "−")
                for column in (DELIVERED, ADAPTED)
            )
        )
        walls = [json.loads((f / "summary.json").read_text())["wall_time"] for f in (gpu, cpu)]
        cells += [f"{w:.0f} s" for w in walls]
        problems += said(text, f"| {GPU_LABELS[algorithm]} | " + " | ".join(cells) + " |", "gpu.md")
    return problems


def gpu_problems(text: str) -> list[str]:
    """docs/measurements/gpu.md: GPU − CPU per client for the four rows run on both; the largest in standard
    errors is pFedLA's, as the page gives it, none separated; and what else differs between the cells."""
    problems, ratios = [], {}
    for algorithm in GPU_ROWS:
        (gpu,) = cells_of("table1-full-gpu", algorithm).values()
        cpu = PUBLISHED / "table1-full" / gpu.name  # the same cell id: the same configuration
        for column in (DELIVERED, ADAPTED):
            p = difference({0: gpu}, {0: cpu}, column)
            ratios[algorithm, column] = abs(p.mean) / p.se if p.se else 0.0
            if p.separated:
                problems.append(f"gpu.md: {algorithm} GPU − CPU is separated ({column})")
    largest = max(ratios, key=ratios.get)
    if largest[0] != "pfedla":
        problems.append(f"gpu.md: the largest GPU − CPU difference is {largest}, not pFedLA's")
    problems += said(
        text,
        f"is {ratios['pfedla', DELIVERED]:.2f} standard errors of its per-client difference as "
        f"delivered and {ratios['pfedla', ADAPTED]:.2f} adapted",
        "gpu.md",
    )
    (gpu,) = cells_of("table1-full-gpu", "pfedla").values()
    cpu = PUBLISHED / "table1-full" / gpu.name
    on = {
        name: (json.loads((f / "config.json").read_text())["versions"], json.loads((f / "summary.json").read_text()))
        for name, f in (("cpu", cpu), ("gpu", gpu))
    }
    torch = [on[k][0]["torch"].split("+")[0] for k in ("cpu", "gpu")]
    python = [on[k][0]["python"] for k in ("cpu", "gpu")]
    problems += said(text, f"different PyTorch builds ({torch[0]} against {torch[1]})", "gpu.md")
    problems += said(text, f"Python versions ({python[0]} against {python[1]})", "gpu.md")
    problems += said(text, f"(`client_batching: {on['cpu'][1]['client_batching']}`", "gpu.md")
    problems += said(text, f"(`{on['gpu'][1]['client_batching']}`)", "gpu.md")
    return problems


def ties_problems(text: str) -> list[str]:
    """docs/explanation/ties.md's example: table1-full after adaptation, FedAvg − Local and the tied means."""
    column = "table1-full"
    fedavg, local = cells_of(column, "fedavg"), cells_of(column, "local")
    d = difference(fedavg, local, ADAPTED)
    problems = said(
        text, f"FedAvg − Local is {pm(d)} points, {d.up} clients up and {d.down} down (p = {d.p:.3f})", "ties.md"
    )
    means = {a: sample(cells_of(column, a), ADAPTED).values[0] for a in ("fedavg", "fedrep", "perfedavg")}
    problems += said(text, f"the highest mean, {means['fedavg']:.2f} —", "ties.md")
    return problems + said(text, f"FedRep ({means['fedrep']:.2f}) and Per-FedAvg ({means['perfedavg']:.2f})", "ties.md")


def perfedavg_problems(text: str) -> list[str]:
    """docs/algorithms/perfedavg.md: Table 2's Per-FedAvg curves at three seeds, as delivered, and where they
    end after adaptation (benchmarks/analysis/curve.py's numbers)."""
    from curve import largest_fall, mean_curve

    stores = {0: "table2-full", 1: "table2-full-seed1", 2: "table2-full-seed2"}
    cells = {seed: cells_of(store, "perfedavg")[seed] for seed, store in stores.items()}
    labels = {0: "0 (`table2-full`)", 1: "1", 2: "2"}
    problems: list[str] = []
    for seed, folder in cells.items():
        curve = mean_curve(folder, DELIVERED).dropna()
        best = int(curve.idxmax())
        before, after, fall = largest_fall(curve)
        at = " | ".join(f"{curve[r]:.2f}" for r in (300, 400, 460, 480, 490, 500, 550, 600))
        row = f"| {labels[seed]} | {at} | {best}: {curve[best]:.2f} | {before} → {after}: {fall:.2f} |"
        problems += said(text, row, "perfedavg.md")
    zero = mean_curve(cells[0], DELIVERED)
    problems += said(text, f"falls to {zero[500]:.1f} at round 500 and {zero[600]:.1f} at 600", "perfedavg.md")
    end = {seed: sample({seed: folder}, ADAPTED).values[seed] for seed, folder in cells.items()}
    return problems + said(
        text, f"seeds 1 and 2 end at {end[1]:.2f} and {end[2]:.2f} (seed 0: {end[0]:.2f})", "perfedavg.md"
    )


FEDDBE_KAPPA_ROWS = {  # docs/algorithms/feddbe.md's table: row label -> kappa (study table1-feddbe-kappa)
    "0 (MR off)": 0.0,
    "0.05": 0.05,
    "0.5": 0.5,
    "5": 5.0,
    "50 (official run script, default)": 50.0,
}


def feddbe_kappa_problems(text: str) -> list[str]:
    """docs/algorithms/feddbe.md: each kappa's mean client validation accuracy as delivered at rounds 5-20, adapted
    at round 20, test delivered / adapted at round 20 and wall seconds, and the kappa validation chooses."""
    from pflbench.reports.cells import read_metrics

    problems: list[str] = []
    final: dict[str, float] = {}
    for label, kappa in FEDDBE_KAPPA_ROWS.items():
        (folder,) = cells_of("table1-feddbe-kappa", "feddbe", kappa=kappa).values()
        curve = read_metrics(folder).groupby("round")["val_accuracy"].mean() * 100
        at = " / ".join(f"{curve[r]:.1f}" for r in (5, 10, 15, 20))
        last = {
            c: float(np.mean(list(last_round_clients(folder, c).values())))
            for c in ("val_accuracy_adapted", DELIVERED, ADAPTED)
        }
        wall = json.loads((folder / "summary.json").read_text())["wall_time"]
        row = (
            f"| {label} | {at} | {last['val_accuracy_adapted']:.1f} | {last[DELIVERED]:.1f} / {last[ADAPTED]:.1f} "
            f"| {wall:.0f} |"
        )
        problems += said(text, row, "feddbe.md")
        final[label] = float(curve[20])
    best = max(final, key=final.__getitem__)
    return problems + said(
        text, f"Validation chooses `kappa` {best.split()[0]} ({final[best]:.1f} at round 20)", "feddbe.md"
    )


# ---- the tests -------------------------------------------------------------------------------------------

CHECKS = {
    "reproduction/index.md": chain_problems,
    "reproduction/table1-fmnist.md": table1_problems,
    "reproduction/table2-fmnist.md": table2_problems,
    "algorithms/pfedla.md": alive_table_problems,
    "measurements/gpu.md": lambda text: gpu_problems(text) + gpu_table_problems(text),
    "explanation/ties.md": ties_problems,
    "algorithms/perfedavg.md": perfedavg_problems,
    "algorithms/feddbe.md": feddbe_kappa_problems,
}


@pytest.mark.parametrize("relative", list(CHECKS))
def test_the_prose_numbers_are_the_stores(relative):
    assert CHECKS[relative](page(relative)) == []


PLANTED = [  # a drifted number in each page: the check must see it
    ("reproduction/index.md", "−1.60 ± 0.35", "−1.50 ± 0.35"),
    ("reproduction/table1-fmnist.md", "+7.36 ± 2.24", "+7.63 ± 2.24"),
    ("reproduction/table1-fmnist.md", "| −0.19 ± 0.20 (3 up, 4 down) | 99.2", "| −0.19 ± 0.20 (3 up, 5 down) | 99.2"),
    ("reproduction/table2-fmnist.md", "intervals reach +2.7 points", "intervals reach +2.0 points"),
    ("reproduction/table2-fmnist.md", "| +7.76 ± 0.61 (10 up, 0 down) |", "| +7.67 ± 0.61 (10 up, 0 down) |"),
    ("reproduction/table2-fmnist.md", "99.6% (seed 2)", "99.2% (seed 2)"),
    ("reproduction/table2-fmnist.md", "+0.71 ± 0.69 adapted", "+0.71 ± 0.96 adapted"),
    ("reproduction/table2-fmnist.md", "65.66 at round 600, as delivered", "65.56 at round 600, as delivered"),
    ("reproduction/table2-fmnist.md", "at 68.87 at round 600", "at 68.78 at round 600"),
    ("algorithms/pfedla.md", "| 18.0 / 18.0 / 18.0 / 18.0% ", "| 0 / 0 / 0 / 0% "),
    ("measurements/gpu.md", "1.30 standard errors", "1.2 standard errors"),
    ("measurements/gpu.md", "| 92.24 / 92.57 |", "| 92.24 / 92.75 |"),
    ("measurements/gpu.md", "| 0.52 | −1.52 / −2.14 |", "| 0.25 | −1.52 / −2.14 |"),
    ("explanation/ties.md", "(p = 0.014)", "(p = 0.041)"),
    ("explanation/ties.md", "Per-FedAvg (92.43)", "Per-FedAvg (92.34)"),
    ("algorithms/perfedavg.md", "| 85.19 | 85.52 |", "| 85.19 | 85.25 |"),
    ("algorithms/perfedavg.md", "(seed 0: 82.24)", "(seed 0: 82.42)"),
    ("algorithms/feddbe.md", "| 49.0 / 52.9 / 60.0 / 64.3 |", "| 49.0 / 52.9 / 60.0 / 63.4 |"),
    ("algorithms/feddbe.md", "chooses `kappa` 5 (64.3", "chooses `kappa` 0.5 (64.3"),
]


@pytest.mark.parametrize("relative,old,new", PLANTED)
def test_a_drifted_number_is_caught(relative, old, new):
    text = page(relative)
    assert old in text, f"{relative}: the planted number's original is not on the page"
    assert CHECKS[relative](text.replace(old, new)) != []


# The paper-scale columns' tables: benchmarks/analysis/column_table.py's output, as the pages show it.
COLUMN_TABLES = {
    "reproduction/table1-fmnist.md": (
        "table1-full",
        "table1-full-seed1",
        "table1-full-pfedhn-official",
        "table1-full-seed1-pfedhn-official",
        "table1-full-pfedhn-epochs",
        "table1-full-perfedavg-beta",
        "table1-full-perfedavg-beta-5e-3",
        "table1-pfedla-server",
    ),
    "reproduction/table2-fmnist.md": (
        "table2-full",
        "table2-full-pfedhn-official",
        "table2-full-centralized",
        "table2-full-seed1",
        "table2-full-seed1-pfedhn-official",
        "table2-full-seed2",
        "table2-full-seed2-pfedhn-official",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("relative", list(COLUMN_TABLES))
def test_the_column_tables_are_column_tables_output(relative, capsys):
    import column_table

    text = page(relative)
    stores = COLUMN_TABLES[relative]
    command = " ".join(f"results/published/{s}" for s in stores)
    assert " ".join(command.split()) in " ".join(text.replace("\\\n", " ").split()), (
        f"{relative}: the regenerating command names other stores"
    )
    assert column_table.main([str(PUBLISHED / s) for s in stores]) == 0
    generated = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert generated, "column_table.py printed nothing"
    shown = [line for line in text.splitlines() if line.strip()]
    missing = [line for line in generated if line not in shown]
    assert missing == [], f"{relative}: lines of column_table.py's output not on the page: {missing[:3]}"
