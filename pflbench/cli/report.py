"""`pflbench report`: the tables, figures and HTML leaderboard of a results store
(the work is done by the `pflbench.reports` package, imported when a report is built: it brings pandas
and matplotlib, which `pflbench --help` should not wait for; this module is the subcommand)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = subparsers.add_parser(
        "report",
        help="tables (Markdown, LaTeX), figures and the HTML leaderboard of a results store",
        description="Writes OUT/report.md, OUT/report.tex, OUT/index.html (open it in a browser: no server "
        "needed), a page per cell under OUT/cells/ and the figures under OUT/figures/.",
    )
    report.add_argument("--results", type=Path, default=Path("results"), help="results store (default: results)")
    report.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    report.add_argument(
        "--reference", type=Path, help="folder of papers' numbers as CSV (default: benchmarks/reference, when present)"
    )
    report.add_argument("--no-figures", action="store_true", help="tables and pages only (fastest)")
    report.add_argument("--no-cell-figures", action="store_true", help="no figures on the per-cell pages")
    report.add_argument(
        "--no-partitions",
        action="store_true",
        help="skip the label-distribution figures (they load each partition's dataset)",
    )
    report.add_argument("--formats", default="png,svg", help="figure formats, comma-separated (default: png,svg)")
    report.add_argument(
        "--alpha-layer", help="pFedLA Figure 6: the layer to draw, by name or index (default: the last)"
    )
    report.add_argument("--alpha-round", type=int, help="pFedLA Figures 6-7: the round (default: the last stored)")
    report.add_argument("--target-client", type=int, default=0, help="pFedLA Figures 5 and 7: the client (default: 0)")
    report.add_argument(
        "--root", type=Path, help="data root, for the label distributions (default: $PFLBENCH_DATA or ./data)"
    )
    report.add_argument("--from", dest="mirror", type=Path, help="offline data mirror (default: $PFLBENCH_DATA_MIRROR)")
    report.add_argument(
        "--baseline",
        metavar="ROW",
        help="the difference view's reference row: an algorithm's name (local, fedavg, ...) or a row's "
        "label as the tables show it (default: local, where the store has it)",
    )
    report.add_argument(
        "--level",
        type=float,
        default=0.05,
        help="level of the paired tests behind bold, the ≈ tie marks, the intervals and the ranks (default 0.05)",
    )
    report.add_argument(
        "--beside",
        type=Path,
        action="append",
        default=[],
        metavar="STORE",
        help="another store (e.g. a published study of variants) whose cells join this one's "
        "tables, their rows told apart by what differs (repeatable)",
    )
    report.add_argument("--quiet", action="store_true", help="do not print the Markdown tables")
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    formats = tuple(f.strip().lower() for f in args.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in ("png", "svg", "pdf")]
    if bad or not formats:
        raise SystemExit(f"--formats: unknown format(s) {', '.join(bad) or '(none)'}; allowed: png, svg, pdf")
    if not 0 < args.level < 1:
        raise SystemExit(f"--level must be a probability strictly between 0 and 1 (e.g. 0.05), got {args.level}")
    if not args.results.is_dir():
        print(
            f"report: no results store at {args.results} (no such folder); give the folder `pflbench run` "
            f"wrote with --results DIR (default: results)",
            file=sys.stderr,
        )
        return 2
    for store in args.beside:
        if not store.is_dir():
            print(f"report: --beside {store}: no such results store (folder)", file=sys.stderr)
            return 2
    from pflbench.reports.build import ReportOptions, build_reports
    from pflbench.reports.differences import DEFAULT_BASELINE, UnknownBaseline

    options = ReportOptions(
        reference=args.reference,
        figures=not args.no_figures,
        cell_figures=not args.no_cell_figures,
        partitions=not args.no_partitions,
        formats=("png", *[f for f in formats if f != "png"]),  # pages show the PNGs
        alpha_layer=args.alpha_layer,
        alpha_round=args.alpha_round,
        target_client=args.target_client,
        data_root=args.root,
        mirror=args.mirror,
        level=args.level,
        baseline=args.baseline or DEFAULT_BASELINE,
        baseline_required=args.baseline is not None,
        beside=tuple(args.beside),
    )
    try:
        report = build_reports(args.results, args.out, options)
    except UnknownBaseline as error:
        print(f"report: --baseline: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk: the line `pflbench run` gives (pflbench/storage/store.py's DiskFull)
        from pflbench.run.stops import DISK_FULL_EXIT
        from pflbench.storage.store import disk_full_in

        full = disk_full_in(error, args.out)
        if full is None:
            raise
        print(f"{full}; free space and run the same command again", file=sys.stderr)
        return DISK_FULL_EXIT
    if not args.quiet:
        print(report.markdown.read_text())
    for note in report.notes:
        print(f"note: {note}")
    print(f"written: {report.markdown}, {report.latex}, {report.index} (open it in a browser)")
    return 0
