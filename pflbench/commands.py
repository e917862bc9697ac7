"""The engine's own subcommands: `list`, `data prepare|show`, `bench`, `train`, `store check`."""
from __future__ import annotations

import argparse
import json
import sys

import torch


def add_parser(subparsers) -> None:
    listing = subparsers.add_parser("list", help="list registered algorithms, datasets, partitions or models")
    listing.add_argument("what", choices=["algorithms", "datasets", "partitions", "models"])
    listing.set_defaults(func=cmd_list)

    data = subparsers.add_parser("data", help="prepare datasets, inspect partitions")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = data_sub.add_parser("prepare", help="put dataset files where torchvision looks (from a mirror or a download) and cache them")
    prepare.add_argument("names", nargs="*", help="datasets (default: every one the mirror has)")
    add_data_options(prepare)
    prepare.set_defaults(func=cmd_data_prepare)
    show = data_sub.add_parser("show", help="print (and plot) a partition's per-client label counts")
    show.add_argument("dataset")
    show.add_argument("--partition", default="pathological")
    show.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="partition parameter (repeatable)")
    show.add_argument("--clients", type=int, default=10)
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--split", default="all", choices=["all", "train", "val", "test"])
    show.add_argument("--plot", metavar="PATH", help="also draw the counts (PNG or SVG)")
    add_data_options(show)
    show.set_defaults(func=cmd_data_show)

    bench = subparsers.add_parser("bench", help="training throughput of the federated engine vs centralized training")
    bench.add_argument("--clients", type=int, default=10)
    bench.add_argument("--samples", type=int, default=512, help="samples per client")
    bench.add_argument("--batch-size", type=int, default=32)
    bench.add_argument("--shape", default="3,32,32", help="sample shape, e.g. 3,32,32 or 1,28,28")
    bench.add_argument("--classes", type=int, default=10)
    bench.add_argument("--model", default="cnn")
    bench.add_argument("--rounds", type=int, default=1, help="timed rounds per measurement")
    bench.add_argument("--repeats", type=int, default=8, help="measurements per way, interleaved (best kept)")
    bench.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    bench.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    bench.set_defaults(func=cmd_bench)


    store = subparsers.add_parser("store", help="inspect a results store")
    store_sub = store.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    check = store_sub.add_parser("check", help="list damaged cells (files truncated, garbled, missing) and foreign "
                                               "folders (name is not the hash of the configuration inside)")
    check.add_argument("--results", default="results", help="results store (default: results)")
    check.set_defaults(func=cmd_store_check)


def cmd_store_check(args) -> int:
    """Exit 0 when every cell folder with a summary is an intact result, 1 otherwise."""
    from pathlib import Path

    from pflbench.store import SET_ASIDE, scan_store

    if not Path(args.results).is_dir():
        print(f"no results store at {args.results}", file=sys.stderr)
        return 2
    intact, problems = scan_store(args.results)
    for problem in problems:
        print(problem)
    aside = Path(args.results) / SET_ASIDE
    kept = len([p for p in aside.iterdir() if p.is_dir()]) if aside.is_dir() else 0
    print(f"{args.results}: {len(intact)} intact cells, {len({p.folder for p in problems if p.kind == 'damaged'})} "
          f"damaged, {len({p.folder for p in problems if p.kind == 'foreign'})} foreign"
          + (f"; {kept} damaged folders set aside earlier in {aside}" if kept else ""))
    return 1 if problems else 0


def add_data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", help="data root (default: $PFLBENCH_DATA or ./data)")
    parser.add_argument("--from", dest="mirror", help="offline mirror folder (default: $PFLBENCH_DATA_MIRROR)")


def field_default(field):
    """A pydantic field's default, including one given by a default_factory (e.g. a list)."""
    return field.get_default(call_default_factory=True)


def cmd_list(args) -> int:
    if args.what == "algorithms":
        from pflbench.algorithm import ALGORITHMS, get_algorithm

        get_algorithm("fedavg")  # imports the algorithms package
        for name, cls in ALGORITHMS.items():
            fields = ", ".join(f"{k}={field_default(f)!r}" for k, f in cls.Hyperparams.model_fields.items())
            path = "" if cls.batched else "  [client loop only]"
            print(f"{name:<14}{fields or '-'}{path}")
    elif args.what == "datasets":
        from pflbench.data import DATASET_INFO

        for name, info in sorted(DATASET_INFO.items()):
            print(f"{name:<18}{info}")
    elif args.what == "partitions":
        import partitions  # noqa: F401
        from pflbench.partitioning import PARTITIONS

        for name, cls in PARTITIONS.items():
            fields = ", ".join(f"{k}={field_default(f)!r}" for k, f in cls.Params.model_fields.items())
            print(f"{name:<14}{fields or '-'}")
    else:
        from pflbench.models import MODELS

        print("\n".join(MODELS.names()))
    return 0


def cmd_data_prepare(args) -> int:
    from pflbench.data import prepare

    for line in prepare(args.names or None, root=args.root, mirror=args.mirror):
        print(line)
    return 0


def parse_value(text: str):
    """A command-line value as JSON where it parses (numbers, booleans, lists), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: list[str]) -> dict:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        result[key.strip()] = parse_value(value)
    return result


def cmd_data_show(args) -> int:
    import partitions  # noqa: F401
    from pflbench.data import load_dataset
    from pflbench.partitioning import format_label_counts, make_splits, plot_label_counts

    dataset = load_dataset(args.dataset, root=args.root, mirror=args.mirror)
    labels = dataset.labels.numpy()
    splits = make_splits(labels, dataset.num_classes, scheme=args.partition,
                         params=parse_assignments(args.param), num_clients=args.clients, seed=args.seed)
    counts = splits.label_counts(labels, dataset.num_classes, split=args.split)
    print(format_label_counts(counts, dataset.classes))
    if args.plot:
        plot_label_counts(counts, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def cmd_bench(args) -> int:
    from pflbench.bench import format_bench, run_bench, write_json

    shape = tuple(int(s) for s in args.shape.split(","))
    result = run_bench(clients=args.clients, samples=args.samples, batch_size=args.batch_size, shape=shape,
                       num_classes=args.classes, model=args.model, rounds=args.rounds,
                       repeats=args.repeats, device=args.device)
    print(format_bench(result))
    if args.json:
        write_json(result, args.json)
        print(f"JSON written to {args.json}", file=sys.stderr)
    return 0
