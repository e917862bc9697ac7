"""`pflbench publish`, `rerun`, `verify` and `leaderboard`: the subcommands of published results
(the work is done by pflbench/studies/publish.py, pflbench/studies/verify.py and pflbench/reports/studies.py).

Only the standard library is imported here (see COMMAND_MODULES in pflbench/cli/__init__.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

PUBLISHED = Path("results") / "published"  # pflbench.studies.publish.PUBLISHED, without importing it
WATCH_BUDGET = 720.0  # pflbench.studies.watch.BUDGET, without importing it

if TYPE_CHECKING:
    from pflbench.studies.verify import CellCheck
    from pflbench.studies.watch import PublishedCell


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from pflbench.cli.commands import add_data_options, add_set_option

    publish = subparsers.add_parser(
        "publish",
        help="copy a run's cells into results/published/STUDY (slimmed, with a manifest)",
        description="Copies the cells of `pflbench run SPEC [--scale S] [--set ...]` from the store that run "
        "wrote into results/published/STUDY, keeping what the reports read, with manifest.json: "
        "the command, the pflbench commit, torch/Python versions, the machines, the date and the "
        "wall time. Give the same SPEC, --scale and --set as the run.",
    )
    publish.add_argument("spec", help="the spec the run used, e.g. benchmarks/table1.yaml")
    publish.add_argument("--study", required=True, help="the study's folder name, e.g. table1-quick")
    publish.add_argument("--scale", help="the run's --scale")
    add_set_option(publish, help="the run's --set items, in the same order (repeatable)")
    publish.add_argument("--results", type=Path, default=Path("results"), help="the run's store (default: results)")
    publish.add_argument("--out", type=Path, default=PUBLISHED, help=f"published studies (default: {PUBLISHED})")
    publish.add_argument("--note", help="a sentence for the manifest (e.g. what the study is for)")
    publish.add_argument("--replace", action="store_true", help="publish over an existing study of that name")
    publish.add_argument(
        "--allow-dirty",
        action="store_true",
        help="publish from a checkout whose code has uncommitted changes (the manifest says so)",
    )
    publish.set_defaults(func=cmd_publish)

    rerun = subparsers.add_parser(
        "rerun",
        help="run one stored cell again from its stored configuration and compare its metrics",
        description="Finds the cell in --results (default: the published studies), runs it again from its "
        "config.json with the execution options it recorded, compares the per-round metrics with "
        "the stored ones (identical on the same kind of machine; within a tolerance elsewhere: "
        "pflbench/studies/verify.py) and writes the new result into --out. Exit 1 when they differ.",
    )
    rerun.add_argument("cell", help="a cell id (12 hex digits, as on the leaderboard)")
    rerun.add_argument(
        "--results",
        type=Path,
        action="append",
        help=f"store(s) or published roots to look in (default: {PUBLISHED}, then results)",
    )
    rerun.add_argument(
        "--out",
        type=Path,
        default=Path("results") / "rerun",
        help="store the rerun's result is written to (default: results/rerun)",
    )
    add_data_options(rerun)
    rerun.set_defaults(func=cmd_rerun)

    verify = subparsers.add_parser(
        "verify",
        help="re-run a random sample of a published study's cells and compare with the stored metrics",
        description="Re-runs K cells of the study chosen at random (--seed) and compares each one's per-round "
        "metrics with the stored ones: identical where the machine is of the kind the cell ran on "
        "(CPU model, device, GPU, torch), else within a stated tolerance (pflbench/studies/verify.py). Also "
        "reports damaged files and cells whose id the current code changes. Exit 1 on any difference.",
    )
    verify.add_argument("study", type=Path, help="a published study folder, e.g. results/published/table1-quick")
    verify.add_argument("--sample", type=int, default=3, metavar="K", help="cells to re-run (default: 3; 0: all)")
    verify.add_argument("--seed", type=int, default=0, help="the sample's random seed (default: 0)")
    verify.add_argument(
        "--max-seconds",
        type=float,
        help="draw only among cells whose stored wall time is at most this (cheap cells, for CI)",
    )
    verify.add_argument("--cell", dest="cells", action="append", metavar="ID", help="verify this cell (repeatable)")
    verify.add_argument(
        "--rounds",
        type=int,
        metavar="R",
        help="re-run only each cell's first R rounds (up to its next evaluation round) and compare "
        "those: a paper-scale cell checked in minutes (--max-seconds then counts their share)",
    )
    verify.add_argument(
        "--tolerance", action="store_true", help="compare within the tolerance even on the same kind of machine"
    )
    add_data_options(verify)
    verify.set_defaults(func=cmd_verify)

    watch = subparsers.add_parser(
        "watch",
        help="re-run the first evaluation of a share of all published cells (CI: pflbench/studies/watch.py)",
        description="Re-runs the first evaluation of published cells, from every study: a fixed slice of them "
        "(--slice K/N: N consecutive slices cover every cell once), the cheapest cell of each "
        "algorithm, model and client path (--representatives), or cells named. Each is compared "
        "with the fingerprint recorded for this kind of machine (bit for bit), else with the stored "
        "metrics as `verify` compares them. Exit 1, naming cell, study and commit, when one moved.",
    )
    watch.add_argument(
        "--published", type=Path, default=PUBLISHED, help="published studies (default: results/published)"
    )
    watch.add_argument("--slice", metavar="K/N", help="the cells of slice K of N, cut by count (by a hash of the name)")
    watch.add_argument(
        "--turn",
        type=int,
        metavar="T",
        help="the cells of slice T mod N of the slices cut by cost, each at most --budget as stored "
        "(CI: T = commits on main)",
    )
    watch.add_argument(
        "--budget",
        type=float,
        default=WATCH_BUDGET,
        metavar="SECONDS",
        help=f"--turn: a slice's stored first-evaluation cost at most (default: {WATCH_BUDGET:.0f})",
    )
    watch.add_argument(
        "--representatives",
        action="store_true",
        help="the cheapest finished CPU cell of each (algorithm, model, client path)",
    )
    watch.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="representatives: at most this first-evaluation time as stored (default: 120)",
    )
    watch.add_argument(
        "--cell",
        dest="cells",
        action="append",
        default=[],
        metavar="STUDY/ID",
        help="watch this published cell (e.g. table1-quick/064736ea5376; repeatable)",
    )
    watch.add_argument(
        "--record",
        action="store_true",
        help="file this machine kind's fingerprint of each cell that repeats its stored metrics",
    )
    watch.add_argument("--fingerprints", type=Path, help="fingerprint file (default: PUBLISHED/fingerprints.json)")
    watch.add_argument("--commit", help="the commit to name (default: the checkout's)")
    watch.add_argument(
        "--reference",
        type=Path,
        metavar="STORE",
        help="a store with cells re-run on this kind of machine at their published commit: a cell "
        "whose stored run (from another kind) differs is compared with its run there instead",
    )
    add_data_options(watch)
    watch.set_defaults(func=cmd_watch)

    board = subparsers.add_parser(
        "leaderboard",
        help="the site of all published studies: an index, and each study's report",
        description="Writes OUT/index.html (the studies: commit, machine, date, wall time, stale or failed) and "
        "OUT/<study>/ (each study's tables, figures and cell pages, as `pflbench report`).",
    )
    board.add_argument("--published", type=Path, default=PUBLISHED, help=f"published studies (default: {PUBLISHED})")
    board.add_argument(
        "--out", type=Path, default=Path("reports") / "leaderboard", help="output folder (default: reports/leaderboard)"
    )
    board.add_argument(
        "--store",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also show an unpublished store as a study (e.g. ci=results/ci: this CI run); repeatable",
    )
    board.add_argument("--no-figures", action="store_true", help="tables and pages only (fastest)")
    board.add_argument(
        "--docs-url",
        metavar="URL",
        help="the documentation site, linked from every page; a relative URL is taken from the "
        "leaderboard's index.html (make leaderboard: ../../site/index.html, where make docs builds it)",
    )
    board.add_argument(
        "--no-partitions",
        action="store_true",
        help="skip the label-distribution figures (they load each partition's dataset)",
    )
    add_data_options(board)
    board.set_defaults(func=cmd_leaderboard)


def cmd_publish(args: argparse.Namespace) -> int:
    from pflbench.studies.publish import PublishError, publish
    from pflbench.run.spec_problems import SpecError

    if not args.results.is_dir():
        print(
            f"publish: no results store at {args.results}; give the store the run wrote (--results DIR)",
            file=sys.stderr,
        )
        return 2
    try:
        target = publish(
            args.spec,
            args.study,
            args.results,
            scale=args.scale,
            sets=args.sets,
            out=args.out,
            note=args.note,
            replace=args.replace,
            allow_dirty=args.allow_dirty,
        )
    except (PublishError, SpecError) as error:
        print(f"publish: {error}", file=sys.stderr)
        return 2
    from pflbench.studies.publish import read_manifest

    manifest = read_manifest(target)
    assert manifest is not None, target  # publish wrote it
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    print(
        f"published {len(manifest['cells'])} cells to {target} ({size / 1e6:.2f} MB); "
        f"statuses {manifest['statuses']}"
        + (f"; {len(manifest['missing'])} planned cells have no result" if manifest["missing"] else "")
    )
    return 0


def _curve_text(values: list[float]) -> str:
    return " ".join(f"{v * 100:.2f}" for v in values)


def print_check(check: CellCheck) -> None:
    print(
        f"{check.cell_id}"
        + (f" ({check.label})" if check.label else "")
        + (f", first {check.rounds} rounds" if check.rounds is not None else "")
        + f": {check.verdict}"
        + (f" ({check.why_tolerance})" if check.mode == "tolerance" else "")
        + (f" [{check.seconds:.1f} s]" if check.seconds is not None else "")
    )
    print(f"  mean test accuracy per eval round, stored: {_curve_text(check.stored_curve)}")
    print(f"  mean test accuracy per eval round, rerun:  {_curve_text(check.rerun_curve)}")
    for note in check.notes:
        print(f"  {note}")
    for difference in check.differences:
        print(f"  differs: {difference}")


def cmd_rerun(args: argparse.Namespace) -> int:
    from pflbench.studies.publish import find_cell
    from pflbench.studies.verify import check_cell

    roots = args.results or [PUBLISHED, Path("results")]
    try:
        folder = find_cell(args.cell, roots)
    except FileNotFoundError as error:
        print(f"rerun: {error}", file=sys.stderr)
        return 2
    print(f"rerun: cell {args.cell} from {folder}")
    check = check_cell(folder, data_root=args.root, mirror=args.mirror)
    print_check(check)
    from pflbench.config import CellConfig
    from pflbench.storage.store import Store, read_json_dict

    cell = CellConfig.stored(read_json_dict(folder / "config.json")["cell"])
    assert check.rerun_result is not None  # the check ran the cell (no notes)
    written = Store(args.out).write(cell, check.rerun_result)
    print(f"written: {written}")
    return 0 if check.ok else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from pflbench.studies.publish import read_manifest
    from pflbench.studies.verify import ACCURACY_TOLERANCE, check_cell, sample_cells

    if not args.study.is_dir():
        print(f"verify: no study at {args.study}", file=sys.stderr)
        return 2
    if args.sample < 0:
        print("verify: --sample must be 0 (all cells) or more", file=sys.stderr)
        return 2
    if args.rounds is not None and args.rounds < 1:
        print("verify: --rounds must be 1 or more (the first rounds to re-run)", file=sys.stderr)
        return 2
    try:
        folders = sample_cells(args.study, args.sample or None, args.seed, args.max_seconds, args.cells, args.rounds)
    except ValueError as error:
        print(f"verify: {error}", file=sys.stderr)
        return 2
    if not folders and args.max_seconds is not None:  # CI's cheap sample: a study of costly cells only
        print(
            f"verify: no cell of {args.study} took at most {args.max_seconds:g} s"
            + (f" for its first {args.rounds} rounds" if args.rounds else "")
            + ": nothing verified"
        )
        return 0
    if not folders:
        print(f"verify: {args.study} has no cells", file=sys.stderr)
        return 2
    manifest = read_manifest(args.study) or {}
    print(
        f"verify {args.study}: {len(folders)} cells (seed {args.seed}), published from commit "
        f"{manifest.get('commit') or '?'}; exact on the same kind of machine, else mean accuracy per round "
        f"within ±{ACCURACY_TOLERANCE * 100:g} percentage points"
    )
    checks = []
    for folder in folders:
        check = check_cell(
            folder, data_root=args.root, mirror=args.mirror, force_tolerance=args.tolerance, rounds=args.rounds
        )
        print_check(check)
        checks.append(check)
    bad = [c.cell_id for c in checks if not c.ok]
    print(
        f"verify: {len(checks) - len(bad)} of {len(checks)} cells repeat their stored metrics"
        + (f"; differ or have problems: {', '.join(bad)}" if bad else "")
    )
    return 1 if bad else 0


def cmd_watch(args: argparse.Namespace) -> int:
    from pflbench.run.cost import git_commit
    from pflbench.studies.watch import (
        FINGERPRINTS,
        FingerprintBook,
        machine_key,
        published_cells,
        cost_slices,
        representatives,
        slice_cost,
        slice_of,
        watch_cell,
    )

    if not args.published.is_dir():
        print(f"watch: no published studies at {args.published}", file=sys.stderr)
        return 2
    cells = published_cells(args.published)
    chosen: dict[str, PublishedCell] = {}
    if args.slice:
        try:
            k, n = (int(x) for x in args.slice.split("/"))
            if not 0 <= k < n:
                raise ValueError
        except ValueError:
            print(f"watch: --slice {args.slice!r}: expected K/N with 0 <= K < N (e.g. 3/10)", file=sys.stderr)
            return 2
        chosen.update((c.name, c) for c in cells if slice_of(c.name, n) == k)
    if args.turn is not None:
        if args.turn < 0 or not args.budget > 0:
            print(
                f"watch: --turn {args.turn} --budget {args.budget:g}: expected a turn >= 0 and a budget > 0 seconds",
                file=sys.stderr,
            )
            return 2
        slices, over = cost_slices(cells, args.budget)
        if slices:
            k = args.turn % len(slices)
            chosen.update((c.name, c) for c in slices[k])
            cost = sum(slice_cost(c, cells) for c in slices[k])
            print(
                f"watch: slice {k} of {len(slices)} cut by cost ({len(slices[k])} cells, {cost:.0f} s as stored, "
                f"budget {args.budget:.0f} s): every published cell within {len(slices)} turns"
            )
        for cell in over:
            print(
                f"watch: {cell.name} is a slice of its own: its first evaluation alone costs "
                f"{slice_cost(cell, cells):.0f} s as stored, over the budget"
            )
    if args.representatives:
        chosen.update((c.name, c) for c in representatives(cells, args.max_seconds))
    by_name = {c.name: c for c in cells}
    for name in args.cells:
        if name not in by_name:
            print(
                f"watch: no published cell {name!r} (write STUDY/CELL_ID, e.g. table1-quick/0a1b2c3d4e5f)",
                file=sys.stderr,
            )
            return 2
        chosen[name] = by_name[name]
    if not chosen:
        print(
            "watch: nothing chosen: give --turn T, --slice K/N, --representatives or --cell STUDY/ID", file=sys.stderr
        )
        return 2 if not (args.slice or args.representatives or args.turn is not None) else 0
    commit = args.commit or git_commit()[0]
    book = FingerprintBook(args.fingerprints or args.published / FINGERPRINTS)
    kind = machine_key()
    estimate = sum(c.first_eval_seconds for c in chosen.values())
    print(
        f"watch: {len(chosen)} of {len(cells)} published cells, their first evaluation (about {estimate / 60:.0f} min "
        f"as stored), at commit {str(commit)[:10]} on {kind}"
    )
    failed = []
    for cell in sorted(chosen.values(), key=lambda c: c.name):
        watched = watch_cell(
            cell,
            book,
            kind,
            record=args.record,
            commit=commit,
            data_root=args.root,
            mirror=args.mirror,
            reference=args.reference,
        )
        print(
            f"  {watched.outcome:<24} {cell.name} ({cell.algorithm}, {cell.model}) {watched.seconds:.0f} s"
            + (" [fingerprint recorded]" if watched.recorded else "")
            + (f": {watched.detail}" if watched.detail else ""),
            flush=True,
        )
        if watched.recorded:
            book.save()  # as it goes: a long recording run that is stopped keeps what it filed
        if not watched.ok:
            failed.append(watched)
    for watched in failed:
        print(
            f"{watched.outcome}: cell {watched.cell.folder.name} of study {watched.cell.study} at commit "
            f"{commit}: {watched.detail}",
            file=sys.stderr,
        )
    print(
        f"watch: {len(chosen) - len(failed)} of {len(chosen)} cells repeat"
        + (f"; {len(failed)} do not" if failed else "")
    )
    return 1 if failed else 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    extra = {}
    for item in args.store:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_dir():
            print(f"leaderboard: --store {item!r}: expected NAME=DIR with an existing store folder", file=sys.stderr)
            return 2
        extra[name] = Path(path)
    if not args.published.is_dir() and not extra:
        print(f"leaderboard: no published studies at {args.published} (and no --store)", file=sys.stderr)
        return 2
    from pflbench.reports.build import ReportOptions
    from pflbench.reports.studies import build_leaderboard

    from pflbench.studies.publish import PublishError

    options = ReportOptions(
        figures=not args.no_figures,
        partitions=not args.no_partitions,
        data_root=args.root,
        mirror=args.mirror,
        docs_url=args.docs_url,
    )
    try:
        index = build_leaderboard(args.published, args.out, extra, options)
    except PublishError as error:
        print(f"leaderboard: {error}", file=sys.stderr)
        return 2
    print(f"written: {index} (open it in a browser)")
    return 0
