"""The engine's own subcommands: `list`, `data prepare|show|export`, `bench`, `store check`.

Only the standard library is imported at module level (see COMMAND_MODULES in pflbench/cli/__init__.py): each
command imports the engine (torch, the datasets, ...) when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from pflbench.data.dataset import Dataset
    from pflbench.data.partitioning import ClientSplits


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = subparsers.add_parser("list", help="list registered algorithms, datasets, partitions or models")
    listing.add_argument(
        "what",
        choices=["algorithms", "datasets", "partitions", "models"],
        help="algorithms: hyperparameters with defaults, paper, what each personalizes; "
        "datasets: what each is and whether it is available here; partitions: non-IID "
        "schemes with their parameters; models: model names",
    )
    add_data_options(listing, what="with `list datasets`: where to look for them")
    listing.set_defaults(func=cmd_list)

    data = subparsers.add_parser("data", help="prepare datasets, inspect partitions")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = data_sub.add_parser(
        "prepare", help="put dataset files where torchvision looks (from a mirror or a download) and cache them"
    )
    prepare.add_argument("names", nargs="*", help="datasets (default: every one the mirror has)")
    add_data_options(prepare)
    prepare.set_defaults(func=cmd_data_prepare)
    show = data_sub.add_parser("show", help="print (and plot) a partition's per-client label counts")
    add_partition_options(show, example="classes_per_client=2")
    show.add_argument(
        "--split",
        default="all",
        choices=["all", "train", "val", "test"],
        help="which of each client's splits to count (default: all)",
    )
    show.add_argument("--plot", metavar="PATH", help="also draw the counts (PNG or SVG)")
    add_data_options(show)
    show.set_defaults(func=cmd_data_show)
    export = data_sub.add_parser(
        "export",
        help="write a partition's per-client train/val/test indices for other suites (FL-bench, JSON)",
        description="Write the per-client train/val/test sample indices of a partition as files that FL-bench "
        "(partition.pkl + all_stats.json) and other tools read, and that `{scheme: imported}` reads "
        "back. Indices refer to the dataset as pflbench pools it (torchvision's train set, then its "
        "test set). Format: pflbench/data/interop.py and benchmarks/README.md.",
    )
    add_partition_options(export, example="alpha=0.3")
    export.add_argument("--train-fraction", type=float, default=0.7, help="per-client train share (default: 0.7)")
    export.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="share of each client's train split held out as val (default: 0.1)",
    )
    export.add_argument(
        "--format",
        choices=["both", "flbench", "json"],
        default="both",
        help="flbench: OUT/partition.pkl and OUT/all_stats.json; json: OUT/partition.json (default: both)",
    )
    export.add_argument("--out", required=True, metavar="DIR", help="folder to write the files into")
    add_data_options(export)
    export.set_defaults(func=cmd_data_export)

    bench = subparsers.add_parser("bench", help="training throughput of the federated engine vs centralized training")
    bench.add_argument("--clients", type=int, default=10, help="clients, all sampled every round (default: 10)")
    bench.add_argument("--samples", type=int, default=512, help="samples per client (default: 512)")
    bench.add_argument("--batch-size", type=int, default=32, help="local batch size (default: 32)")
    bench.add_argument("--shape", default="3,32,32", help="sample shape, e.g. 3,32,32 or 1,28,28 (default: 3,32,32)")
    bench.add_argument("--classes", type=int, default=10, help="number of classes (default: 10)")
    bench.add_argument("--model", default="cnn", help="model name (pflbench list models; default: cnn)")
    bench.add_argument("--rounds", type=int, default=1, help="timed rounds per measurement (default: 1)")
    bench.add_argument(
        "--repeats",
        type=int,
        default=8,
        help="measurements per way, interleaved; the best is kept, the spread tells how noisy "
        "the machine was (default: 8)",
    )
    bench.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    bench.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    bench.add_argument("--quiet", action="store_true", help="no progress lines on stderr while measuring")
    bench.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    bench.add_argument(
        "--no-compile", action="store_true", help="leave out the compiled training step (saves its compile time)"
    )
    bench.set_defaults(func=cmd_bench)

    store = subparsers.add_parser("store", help="inspect a results store")
    store_sub = store.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    check = store_sub.add_parser(
        "check",
        help="list damaged cells (files truncated, garbled, missing), foreign "
        "folders (name is not the hash of the configuration inside) and "
        "cells with a round checkpoint (and its round)",
    )
    check.add_argument("--results", default="results", help="results store (default: results)")
    check.set_defaults(func=cmd_store_check)


def cmd_store_check(args: argparse.Namespace) -> int:
    """Exit 0 when every cell folder with a summary is an intact result and every round checkpoint is
    whole (size and checksum) and of its cell, 1 otherwise."""
    from pathlib import Path

    from pflbench.storage.store import SET_ASIDE, scan_store

    if not Path(args.results).is_dir():
        print(f"no results store at {args.results}", file=sys.stderr)
        return 2
    intact, problems = scan_store(args.results)
    for problem in problems:
        print(problem)
    from pflbench.storage.checkpoint import describe_checkpoints, list_checkpoints

    checkpoints = list_checkpoints(args.results)
    for line in describe_checkpoints(args.results, checkpoints):
        print(line)
    bad = sum(1 for entry in checkpoints if entry["problem"])
    aside = Path(args.results) / SET_ASIDE
    kept = len([p for p in aside.iterdir() if p.is_dir()]) if aside.is_dir() else 0
    print(
        f"{args.results}: {len(intact)} intact cells, {len({p.folder for p in problems if p.kind == 'damaged'})} "
        f"damaged, {len({p.folder for p in problems if p.kind == 'foreign'})} foreign"
        + (f"; {len(checkpoints)} round checkpoints, {bad} of them damaged or not their cell's" if checkpoints else "")
        + (f"; {kept} damaged folders set aside earlier in {aside}" if kept else "")
    )
    return 1 if problems or bad else 0


def add_partition_options(parser: argparse.ArgumentParser, example: str) -> None:
    """The dataset and partition a `data show` / `data export` works on."""
    parser.add_argument("dataset", help="a dataset name (pflbench list datasets)")
    parser.add_argument(
        "--partition", default="pathological", help="non-IID scheme (pflbench list partitions; default: pathological)"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"partition parameter, e.g. {example} (repeatable)",
    )
    parser.add_argument("--clients", type=int, default=10, help="number of clients (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="partition seed (default: 0)")


def add_data_options(parser: argparse.ArgumentParser, what: str = "") -> None:
    suffix = f"; {what}" if what else ""
    parser.add_argument("--root", help=f"data root (default: $PFLBENCH_DATA or ./data){suffix}")
    parser.add_argument("--from", dest="mirror", help=f"offline mirror folder (default: $PFLBENCH_DATA_MIRROR){suffix}")


def add_set_option(parser: argparse._ActionsContainer, help: str) -> None:
    """`--set KEY=VALUE` (repeatable, into `args.sets`, in the order given): `pflbench run`'s overrides."""
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help=help)


def field_default(field: FieldInfo) -> Any:
    """A pydantic field's default, including one given by a default_factory (e.g. a list)."""
    return field.get_default(call_default_factory=True)


def name_column(names: Iterable[str], least: int) -> int:
    """Width of `pflbench list`'s name column: `least`, or wider where a name (a plugin's too) needs it."""
    return max([least, *(len(n) + 2 for n in names)])


def cmd_list(args: argparse.Namespace) -> int:
    if args.what == "algorithms":
        from pflbench.algorithm import ALGORITHMS, get_algorithm

        get_algorithm("fedavg")  # imports the algorithms package
        width = name_column(ALGORITHMS.names(), 14)
        for name, cls in ALGORITHMS.items():
            fields = ", ".join(f"{k}={field_default(f)!r}" for k, f in cls.Hyperparams.model_fields.items())
            path = "" if cls.capabilities.batched else "  [client loop only]"
            plugin = f"  [plugin {ALGORITHMS.origin(name)}]" if ALGORITHMS.origin(name) else ""
            print(f"{name:<{width}}{fields or '-'}{path}{plugin}")
            if cls.card.paper:
                print(f"{'':<{width}}paper: {cls.card.paper}")
            if cls.card.personalizes:
                print(f"{'':<{width}}personalizes: {cls.card.personalizes}")
    elif args.what == "datasets":
        from pflbench.data import DATASETS, data_mirror, data_root

        root, mirror = data_root(args.root), data_mirror(args.mirror)
        where = dataset_locations(root, mirror)
        width = name_column(DATASETS.names(), 18)
        for name, source in DATASETS.items():  # the registry itself: plugins' datasets too
            plugin = f"  [plugin {DATASETS.origin(name)}]" if DATASETS.origin(name) else ""
            print(f"{name:<{width}}{where[name]:<22}{source.summary()}{plugin}")
        print(
            f"(data root {root}; mirror {mirror or 'none: $PFLBENCH_DATA_MIRROR is not set'}; "
            f"`pflbench data prepare` places and decodes what the mirror has)"
        )
    elif args.what == "partitions":
        from pflbench.data.partitioning import PARTITIONS
        from pflbench.loader.plugins import load_builtins

        load_builtins()

        width = name_column(PARTITIONS.names(), 14)
        for name, scheme in PARTITIONS.items():
            fields = ", ".join(
                f"{k}={field_default(f)!r}" if not f.is_required() else f"{k} (required)"
                for k, f in scheme.Params.model_fields.items()
            )
            extra = ", any keyword of the partitioner" if scheme.Params.model_config.get("extra") == "allow" else ""
            plugin = f"  [plugin {PARTITIONS.origin(name)}]" if PARTITIONS.origin(name) else ""
            print(f"{name:<{width}}{fields or '-'}{extra}{plugin}")
    else:
        from pflbench.simulator.models import MODELS
        from pflbench.loader.plugins import load_builtins

        load_builtins()
        print(
            "\n".join(
                name + (f"  [plugin {MODELS.origin(name)}]" if MODELS.origin(name) else "") for name in MODELS.names()
            )
        )
    return 0


def dataset_locations(root: Path, mirror: Path | None) -> dict[str, str]:
    """Per dataset name, where it would load from here without network, in a few words; checks that
    files exist (the data-source code's own checks), decodes nothing."""
    from pflbench.data import DATASETS
    from pflbench.data.cache import cache_path
    from pflbench.data.sources import FileSource, GeneratedSource, make_source

    where = {}
    for name in DATASETS.names():
        source = make_source(name, {})
        if isinstance(source, GeneratedSource):
            where[name] = "available (generated)"
            continue
        files = cast(FileSource, source)  # the others read files: FileSource's methods (a plugin's: its own)
        if cache_path(root, files.cache_key()).is_file():
            where[name] = "available (cached)"
        elif files.present(root):
            where[name] = "available (data root)"
        elif mirror is not None and files.in_mirror(mirror):
            where[name] = "available (mirror)"
        else:
            where[name] = "not here"
    return where


def data_error(command: str, error: Exception) -> int:
    """A wrong dataset/partition name or option, or a dataset not found: one message, no traceback."""
    print(f"{command}: {error}", file=sys.stderr)
    return 2


def check_dataset_names(names: list[str]) -> None:
    """UnknownNameError (naming the allowed names) for the first unknown dataset name."""
    from pflbench.data import DATASETS

    for name in names:
        DATASETS.get(name)


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from pflbench.data import DatasetNotFoundError, prepare

    try:
        check_dataset_names(args.names)
        for line in prepare(args.names or None, root=args.root, mirror=args.mirror):
            print(line)
    except (ValueError, DatasetNotFoundError) as error:
        return data_error("data prepare", error)
    return 0


def parse_value(text: str) -> Any:
    """A command-line value as JSON where it parses (numbers, booleans, lists), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: list[str]) -> dict[str, Any]:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        result[key.strip()] = parse_value(value)
    return result


def _partition_of(args: argparse.Namespace, **fractions: Any) -> tuple[Dataset, ClientSplits]:
    """The dataset named by `args` and its partition (`data show`, `data export`); a wrong name or
    parameter, a missing dataset or an impossible partition raises before or instead of the work."""
    from pflbench.data import load_dataset
    from pflbench.loader.plugins import load_builtins

    load_builtins()
    from pflbench.data.partitioning import PARTITIONS, make_splits

    params = parse_assignments(args.param)
    check_dataset_names([args.dataset])
    PARTITIONS.get(args.partition)  # a wrong scheme is reported before the dataset is loaded
    dataset = load_dataset(args.dataset, root=args.root, mirror=args.mirror)
    splits = make_splits(
        dataset.labels.numpy(),
        dataset.num_classes,
        scheme=args.partition,
        params=params,
        num_clients=args.clients,
        seed=args.seed,
        **fractions,
    )
    return dataset, splits


def cmd_data_show(args: argparse.Namespace) -> int:
    from pflbench.data import DatasetNotFoundError
    from pflbench.data.partitioning import format_label_counts
    from pflbench.reports.figures import plot_label_counts

    try:
        dataset, splits = _partition_of(args)
    except (ValueError, DatasetNotFoundError) as error:  # a wrong name or parameter, an impossible partition
        return data_error("data show", error)
    labels = dataset.labels.numpy()
    counts = splits.label_counts(labels, dataset.num_classes, split=args.split)
    print(format_label_counts(counts, dataset.classes))
    if args.plot:
        plot_label_counts(counts, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def cmd_data_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pflbench.data import DatasetNotFoundError
    from pflbench.data.interop import write_partition

    try:
        dataset, splits = _partition_of(args, train_fraction=args.train_fraction, val_fraction=args.val_fraction)
    except (ValueError, DatasetNotFoundError) as error:
        return data_error("data export", error)
    labels = dataset.labels.numpy()
    names = {"flbench": "partition.pkl", "json": "partition.json"}
    for fmt in ("flbench", "json") if args.format == "both" else (args.format,):
        path = write_partition(
            splits,
            Path(args.out) / names[fmt],
            fmt,
            labels=labels,
            num_classes=dataset.num_classes,
            dataset=args.dataset,
        )
        print(f"{fmt}: {path}" + (f" (and {path.with_name('all_stats.json')})" if fmt == "flbench" else ""))
    print(
        f"{splits.num_clients} clients; train/val/test samples: "
        + "/".join(str(sum(map(len, getattr(splits, name)))) for name in ("train", "val", "test"))
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from pflbench.run.bench import format_bench, run_bench, write_json

    shape = tuple(int(s) for s in args.shape.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def progress(line: str) -> None:
        print(f"bench: {line}", file=sys.stderr, flush=True)

    result = run_bench(
        clients=args.clients,
        samples=args.samples,
        batch_size=args.batch_size,
        shape=shape,
        num_classes=args.classes,
        model=args.model,
        rounds=args.rounds,
        repeats=args.repeats,
        device=device,
        compiled=not args.no_compile,
        progress=None if args.quiet else progress,
    )
    print(format_bench(result))
    if args.json:
        write_json(result, args.json)
        print(f"JSON written to {args.json}", file=sys.stderr)
    return 0
