"""The engine's subcommands, run as a user runs them (in-process through `main`)."""

import json

from pflbench.cli import main


def test_list_shows_registered_names(capsys):
    assert main(["list", "algorithms"]) == 0
    out = capsys.readouterr().out
    assert {"fedavg", "local", "fedbn"} <= {line.split()[0] for line in out.splitlines()}
    assert "modules_per_layer=[2, 2, 2]" in out and "Undefined" not in out  # default factories shown
    assert main(["list", "partitions"]) == 0
    out = capsys.readouterr().out
    assert "pathological" in out and "classes_per_client=4" in out and "dirichlet" in out
    # a name longer than the usual column still leaves a gap before its parameters
    assert {line.split()[0]: line.split()[1] for line in out.splitlines()}["random-classes"] == "classes_per_client=4,"
    assert main(["list", "datasets"]) == 0
    assert "cifar10-jpeg" in capsys.readouterr().out


def test_data_show_prints_and_plots_label_counts(tmp_path, capsys):
    plot = tmp_path / "counts.png"
    assert (
        main(
            [
                "data",
                "show",
                "synthetic-images",
                "--partition",
                "pathological",
                "--param",
                "classes_per_client=2",
                "--clients",
                "5",
                "--root",
                str(tmp_path),
                "--plot",
                str(plot),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"
    # five client rows, each with exactly two non-empty classes
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(5))
    assert all(sum(cell != "." for cell in r[1:-1]) == 2 for r in rows)


def test_bench_writes_the_promised_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--clients",
                "2",
                "--samples",
                "64",
                "--shape",
                "1,28,28",
                "--rounds",
                "1",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--no-compile",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    result = json.loads(path.read_text())  # (the compiled way: tests/test_speed.py)
    ways = result["samples_per_second"]
    assert {"default", "plain", "loop", "batched", "centralized_batch32", "centralized_batch64"} == set(ways)
    assert abs(result["ratio_default_to_plain"] - ways["default"] / ways["plain"]) < 1e-9
    assert all(v > 0 for v in ways.values())
    assert result["limit"] == max(ways["centralized_batch32"], ways["centralized_batch64"])
    assert abs(result["ratio_default_to_limit"] - ways["default"] / result["limit"]) < 1e-9
    assert "samples/s" in capsys.readouterr().out
