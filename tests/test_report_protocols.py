"""Evaluation protocols in the reports: every table names its protocol; a paper number gets a Δ only
under the protocol its reference declares and when the cells' settings are the paper's (otherwise
the report lists what differs); the leaderboard switches protocol; stores written before local
adaptation existed still render; the centralized reference row is never ranked."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from report_helpers import write_cell

from pflbench.reports.build import ReportOptions, build_reports
from pflbench.reports.cells import load_cells
from pflbench.reports.protocols import ADAPTED, DEFAULT, PROTOCOLS, Protocol, available
from pflbench.reports.reference import (
    PaperValue,
    default_reference_dir,
    load_references,
    read_reference,
    setting_differences,
)
from pflbench.reports.tables import accuracy_tables
from pflbench.reports.text import latex_report, markdown_table

# pFedLA Table 1, FashionMNIST, 10 clients: its settings (participation 1.0, 10 clients, batch 32 and the
# 70% train split are the defaults): no validation carve-out, and the model `auto` resolves to (`cnn`).
PAPER = dict(
    rounds=600,
    local_epochs=10,
    lr=0.005,
    samples_per_client=700,
    config={"val_fraction": 0.0},
    summary={"model": "cnn"},
)
QUICK = dict(rounds=5, local_epochs=2, lr=0.05, samples_per_client=300)


def md_rows(text: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines()]
    return lines[0], {cells[0]: cells for cells in lines[2:]}


def entry(table, algorithm, params=""):
    row = next(r for r in table.rows if r.algorithm == algorithm)
    column = next(c for c in table.columns if not c.show_params or c.params == params)
    return table.entry(row, column)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    write_cell(root, algorithm="fedavg", accuracies=(0.90,) * 10, adapted=(0.92,) * 10, **PAPER)  # the paper's settings
    write_cell(root, algorithm="local", accuracies=(0.80,) * 10, adapted=(0.85,) * 10, **PAPER)
    # The best numbers of the column, but a reference row: never bold.
    write_cell(root, algorithm="centralized", accuracies=(0.99,) * 10, adapted=(0.995,) * 10, **PAPER)
    write_cell(root, algorithm="pfedla", accuracies=(0.5,) * 10, adapted=(0.6,) * 10, **QUICK)  # the quick scale
    return root


@pytest.fixture(scope="module")
def tables(store):
    cells = load_cells(store)
    refs = load_references(default_reference_dir())
    (delivered,) = accuracy_tables(cells, refs, DEFAULT)
    (adapted,) = accuracy_tables(cells, refs, ADAPTED)
    return delivered, adapted


@pytest.fixture(scope="module")
def site(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    build_reports(store, out, ReportOptions(figures=False))
    return out


def test_protocol_names_keys_and_labels():
    assert DEFAULT.name == "delivered-final-clients" and DEFAULT.key == "final_accuracy"
    assert Protocol.parse("adapted-final-clients") == ADAPTED and ADAPTED.key == "final_accuracy_adapted"
    keys = {p.name: p.key for p in PROTOCOLS}
    assert keys["delivered-final-pooled"] == "final_accuracy_pooled"
    assert keys["adapted-bestval-pooled"] == "bestval_accuracy_adapted_pooled"
    assert keys["adapted-final-worst10"] == "final_worst10_accuracy_adapted"
    assert keys["delivered-bestval-worst10"] == "bestval_worst10_accuracy"
    assert keys["delivered-besttest-clients"] == "best_accuracy"
    assert Protocol("adapted", "bestval").round_key == "bestval_round_adapted"
    assert Protocol("delivered", "besttest").round_key == "best_round" and DEFAULT.round_key is None
    assert DEFAULT.label == "as delivered · final round · mean over clients"
    assert "selected on test" in Protocol(selection="besttest").label
    assert len(set(keys.values())) == len(PROTOCOLS) == 13
    for bad in ("adapted-besttest-clients", "delivered-besttest-pooled", "tuned-final-clients", "final-clients"):
        with pytest.raises(ValueError):
            Protocol.parse(bad)


def test_a_matching_cell_gets_a_delta_under_the_papers_protocol(tables):
    _, adapted = tables
    fedavg = entry(adapted, "fedavg", "samples_per_client=700")
    assert fedavg.comparable and fedavg.delta == pytest.approx(92.0 - 91.24)
    header, rows = md_rows(markdown_table(adapted))
    column = header.index("fmnist, 10 clients (samples\\_per\\_client=700)")
    assert rows["FedAvg"][column : column + 3] == ["**92.00**", "91.24 ± 0.98", "+0.76"]
    assert rows["Local"][column : column + 3] == ["85.00", "85.83 ± 0.17", "-0.83"]
    assert adapted.any_delta


def test_no_delta_where_settings_differ_and_the_differences_are_listed(tables):
    _, adapted = tables
    pfedla = entry(adapted, "pfedla", "samples_per_client=300")
    assert pfedla.paper is not None and pfedla.paper.mean == 94.34
    assert pfedla.delta is None and not pfedla.other_protocol
    reason = adapted.footnotes[pfedla.footnote - 1]
    assert reason == (
        "settings differ (ours vs paper): rounds 5 vs 600, local_epochs 2 vs 10, lr 0.05 vs 0.005, "
        "samples_per_client 300 vs 700, val_fraction 0.1 vs 0, model mlp vs cnn"
    )
    header, rows = md_rows(markdown_table(adapted))
    column = header.index("fmnist, 10 clients (samples\\_per\\_client=300)")
    assert rows["pFedLA"][column : column + 3] == ["60.00", "94.34 ± 0.29", f"– [{pfedla.footnote}]"]
    assert "-34.34" not in markdown_table(adapted)


def test_an_adapted_reference_is_not_compared_with_delivered_numbers(store, tables):
    delivered, _ = tables
    fedavg = entry(delivered, "fedavg", "samples_per_client=700")  # the paper's settings, but as delivered
    assert fedavg.paper is not None and fedavg.other_protocol and fedavg.delta is None
    assert delivered.footnotes[fedavg.footnote - 1] == (
        "protocol differs: the paper's number is after local adaptation · final round · mean over clients"
    )
    header, rows = md_rows(markdown_table(delivered))
    column = header.index("fmnist, 10 clients (samples\\_per\\_client=700)")
    assert rows["FedAvg"][column + 1 : column + 3] == ["(91.24 ± 0.98)", f"– [{fedavg.footnote}]"]
    assert not delivered.any_delta
    # Tables of other protocols show no paper number at all; worst-10% tables never (the papers' are means).
    cells, refs = load_cells(store), load_references(default_reference_dir())
    for protocol in ("delivered-bestval-clients", "adapted-final-pooled", "adapted-final-worst10"):
        assert all(e.paper is None for t in accuracy_tables(cells, refs, protocol) for e in t.entries.values())


def test_a_delivered_reference_and_unconstrained_settings(tmp_path):
    """A reference without a protocol column is as delivered; a settings column it lacks (or leaves
    empty) does not constrain; the adapted check applies to adapted references only."""
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "other.csv").write_text(
        "# source: Other (X), 2024\n# table: Table 9\n"
        "algorithm,dataset,partition,clients,local_epochs,lr,mean,std\n"
        "fedavg,fmnist,pathological,10,,0.01,80.00,\n"
        "local,fmnist,pathological,10,5,,70.00,\n"
    )
    write_cell(tmp_path / "s", algorithm="fedavg", accuracies=(0.85, 0.85), local_epochs=2, lr=0.01)
    write_cell(tmp_path / "s", algorithm="local", accuracies=(0.75, 0.75), local_epochs=2, lr=0.01)
    (table,) = accuracy_tables(load_cells(tmp_path / "s"), load_references(refs))
    fedavg, local = entry(table, "fedavg"), entry(table, "local")
    assert fedavg.delta == pytest.approx(5.0) and fedavg.footnote is None
    assert local.delta is None and table.footnotes[local.footnote - 1].endswith("local_epochs 2 vs 5")
    paper = PaperValue(90.0, None, None, "X", ADAPTED, (("rounds", 3),))
    cells = load_cells(tmp_path / "s")
    assert setting_differences(paper, cells) == ("finetune_epochs 0 vs > 0",)
    assert setting_differences(PaperValue(90.0, None, None, "X", DEFAULT, (("rounds", 3),)), cells) == ()


def test_a_reference_with_an_unknown_protocol_is_an_error(tmp_path):
    (tmp_path / "bad.csv").write_text(
        "algorithm,dataset,partition,clients,protocol,mean\nfedavg,fmnist,pathological,10,adapted-last-clients,80\n"
    )
    with pytest.raises(ValueError, match="protocol.*selection 'last'.*final, bestval, besttest"):
        read_reference(tmp_path / "bad.csv")


def test_centralized_is_never_bold_and_is_listed_apart(tables, site):
    delivered, adapted = tables
    for table in (delivered, adapted):
        assert table.rows[-1].algorithm == "centralized" and table.rows[-1].reference
        central = entry(table, "centralized", "samples_per_client=700")
        fedavg = entry(table, "fedavg", "samples_per_client=700")
        assert central.mean > fedavg.mean and not central.best and fedavg.best
    header, rows = md_rows(markdown_table(adapted))
    column = header.index("fmnist, 10 clients (samples\\_per\\_client=700)")
    assert list(rows)[-1] == "*Centralized (reference)*" and rows["*Centralized (reference)*"][column] == "*99.50*"
    tex = latex_report([adapted], [], [])
    assert re.search(r"\\midrule\n\\textit\{Centralized \(reference\)\} & ", tex)
    assert r"\textbf{99.50}" not in tex and r"\textbf{92.00}" in tex
    html = (site / "index.html").read_text()
    bodies = re.findall(r'<tbody class="reference">(.*?)</tbody>', html, re.S)
    assert len(bodies) >= 2 and all("Centralized (reference)" in body for body in bodies)
    assert not any("best" in c.split() for body in bodies for c in re.findall(r'<td class="([^"]*)"', body))
    boards = re.findall(r'<table class="sortable leaderboard".*?</table>', html, re.S)
    assert boards and all("Centralized" not in re.search(r"<tbody>(.*?)</tbody>", b, re.S)[1] for b in boards)
    assert "99.50" in html


class Captions(HTMLParser):
    """Each leaderboard table: its protocol (data-protocol of its section) and its caption text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.protocol, self.in_caption, self.tables, self.options = None, False, [], []
        self.select = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and "data-protocol" in attrs:
            self.protocol = attrs["data-protocol"]
        if tag == "table" and "leaderboard" in attrs.get("class", ""):
            self.tables.append([self.protocol, ""])
        if tag == "caption" and self.tables and self.tables[-1][1] == "":
            self.in_caption = True
        if tag == "select":
            self.select = attrs.get("id") == "f-protocol"
        if tag == "option" and self.select:
            self.options.append([attrs.get("value"), ""])

    def handle_endtag(self, tag):
        if tag == "caption":
            self.in_caption = False
        if tag == "select":
            self.select = False

    def handle_data(self, data):
        if self.in_caption:
            self.tables[-1][1] += data
        elif self.select and self.options:
            self.options[-1][1] += data


def test_captions_name_the_protocol_in_markdown_latex_and_html(site):
    md = (site / "report.md").read_text()
    for label in (
        "as delivered · final round · mean over clients",
        "after local adaptation · final round · mean over clients",
        "as delivered · best validation round · mean over clients",
        "after local adaptation · best validation round · mean over clients",
    ):
        assert f"### Accuracy, partition pathological (classes\\_per\\_client=4) — {label}" in md or re.search(
            rf"### Accuracy, partition pathological[^\n]* — {re.escape(label)}\n", md
        ), label
        assert f"*Protocol {label}: " in md
    # every table in report.md is followed by its protocol caption
    blocks = re.findall(r"\n\|[^\n]*\|\n(?:\|[^\n]*\|\n)+\n([^\n]*)", md)
    assert blocks and all(b.startswith(("*Protocol ", "*Accuracy: ")) for b in blocks)
    tex = (site / "report.tex").read_text()
    captions = re.findall(r"\\caption\{([^\n]*)\}", tex)
    assert captions and all("Protocol" in c or "Accuracy: as delivered" in c for c in captions)
    assert any("after local adaptation" in c for c in captions)
    parser = Captions()
    parser.feed((site / "index.html").read_text())
    assert parser.tables
    for protocol, caption in parser.tables:
        assert caption.startswith(f"Protocol {Protocol.parse(protocol).label}: "), (protocol, caption)


def test_the_leaderboard_switches_protocol(site):
    html = (site / "index.html").read_text()
    parser = Captions()
    parser.feed(html)
    options = dict(parser.options)
    # shown on opening: the paper's protocol, since this store's FedAvg and Local have a Δ against the paper there
    assert list(options)[0] == "adapted-final-clients"
    assert {
        "adapted-final-clients",
        "delivered-bestval-clients",
        "adapted-bestval-pooled",
        "delivered-final-worst10",
        "delivered-besttest-clients",
    } <= set(options)
    assert (
        options["delivered-besttest-clients"] == "as delivered · best test round (selected on test) · mean over clients"
    )
    assert {p for p, _ in parser.tables} == set(options)  # every option has its tables, and nothing else
    assert 'data-default="adapted-final-clients"' in html
    assert '"protocol"' in html and "data-protocol" in html  # the script filters on it


def test_the_cell_page_shows_delivered_adapted_and_the_best_validation_round(store, site):
    cells = load_cells(store)
    fedavg = cells[cells["algorithm"] == "fedavg"].iloc[0]
    page = (site / "cells" / f"{fedavg['hash']}.html").read_text()
    assert "final accuracy (as delivered) 90.00%" in page and "after local adaptation 92.00%" in page
    assert "best validation round 600 (90.00%)" in page
    scores = re.findall(r'<tr data-protocol="([^"]+)"><td class="text">([^<]+)</td><td>([^<]+)</td>', page)
    assert ("delivered-final-clients", "as delivered · final round", "90.00") in scores
    assert ("adapted-final-clients", "after local adaptation · final round", "92.00") in scores
    assert ("adapted-bestval-clients", "after local adaptation · best validation round", "92.00") in scores
    assert "1 epoch of training" in page and "mean after adaptation (test)" in page


def test_an_old_store_renders_without_adapted_tables(tmp_path):
    old = tmp_path / "old"
    write_cell(old, algorithm="fedavg", accuracies=(0.7, 0.8), legacy=True)
    write_cell(old, algorithm="local", accuracies=(0.8, 0.9), legacy=True)
    write_cell(old, algorithm="local", seed=1, status="failed", error="boom", legacy=True)
    metrics = pd.read_parquet(next(old.glob("*/metrics.parquet")))
    assert "accuracy_adapted" not in metrics and "test_samples" not in metrics
    cells = load_cells(old)
    assert [p.name for p in available(cells)] == [
        "delivered-final-clients",
        "delivered-final-worst10",
        "delivered-besttest-clients",
    ]
    assert (cells["finetune_epochs"] == 0).all()
    report = build_reports(old, tmp_path / "out", ReportOptions(figures=False))
    md, html = report.markdown.read_text(), report.index.read_text()
    assert "as delivered · final round · mean over clients" in md and "| Local |" in md
    assert not re.search(r"^#+ .*(after local adaptation|best validation round)", md, re.M)
    assert 'data-protocol="adapted' not in html and 'value="adapted' not in html
    assert 'value="delivered-final-clients"' in html
    page = next((tmp_path / "out" / "cells").glob("*.html")).read_text()
    assert "only the models as delivered are scored" in page

    # Mixed: one adapted cell beside the old ones. The adapted table holds only cells that were adapted.
    write_cell(old, algorithm="pfedla", accuracies=(0.6, 0.6), adapted=(0.7, 0.7))
    (adapted,) = accuracy_tables(load_cells(old), [], ADAPTED)
    assert [r.algorithm for r in adapted.rows] == ["pfedla"]
    (bestval,) = accuracy_tables(load_cells(old), [], "delivered-bestval-clients")
    # Old finished cells have no best-validation numbers: not entries there (a failed cell stays failed).
    assert {r.algorithm: bestval.entry(r, bestval.columns[0]).text() for r in bestval.rows} == {
        "local": "failed",
        "pfedla": "60.00",
    }


def test_a_cell_without_a_validation_split_is_no_entry_of_the_best_validation_tables(tmp_path):
    """A diverged cell that had no validation split could never have had a best-validation number:
    it is listed as diverged in the final-round tables only (not as a bare "Per-FedAvg: diverged"
    beside the cells that hold validation data)."""
    write_cell(tmp_path, algorithm="fedfomo", accuracies=(0.6, 0.6), config={"val_fraction": 0.1})
    write_cell(tmp_path, algorithm="perfedavg", status="diverged", error="round 2: nan", config={"val_fraction": 0.0})
    write_cell(tmp_path, algorithm="local", status="diverged", error="round 2: nan", config={"val_fraction": 0.1})
    (final,) = accuracy_tables(load_cells(tmp_path), [], "delivered-final-clients")
    assert {r.algorithm: final.entry(r, final.columns[0]).text() for r in final.rows} == {
        "local": "diverged",
        "perfedavg": "diverged",
        "fedfomo": "60.00",
    }
    (bestval,) = accuracy_tables(load_cells(tmp_path), [], "delivered-bestval-clients")
    assert {r.algorithm: bestval.entry(r, bestval.columns[0]).text() for r in bestval.rows} == {
        "local": "diverged",
        "fedfomo": "60.00",
    }


NODE = shutil.which("node") or shutil.which("nodejs")
SHIM = r"""
const fs = require("fs");
const input = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
function El(attrs) { this.attrs = attrs; this.hidden = false; }
El.prototype.getAttribute = function (n) { return n in this.attrs ? this.attrs[n] : null; };
const elements = input.elements.map(a => new El(a));
const select = {tagName: "SELECT", options: input.options, _i: 0, listeners: [],
  get value() { return this._i < 0 ? "" : this.options[this._i]; },
  set value(v) { this._i = this.options.indexOf(v); },
  get selectedIndex() { return this._i; }, set selectedIndex(i) { this._i = i; },
  getAttribute(n) { return n === "data-default" ? input.default : null; },
  addEventListener(ev, fn) { this.listeners.push(fn); }};
const handlers = [];
global.document = {getElementById: id => id === "f-protocol" ? select : null,
  querySelectorAll: sel => sel === ".flt" ? elements : [], addEventListener: (ev, fn) => handlers.push(fn),
  body: {setAttribute() {}}};
global.location = {hash: input.hash, pathname: "/index.html"};
let url = null;
global.history = {replaceState: (a, b, u) => { url = u; }};
eval(fs.readFileSync(process.argv[3], "utf8"));
handlers.forEach(f => f());
const shown = () => elements.filter(e => !e.hidden && e.attrs["data-protocol"]).map(e => e.attrs["data-protocol"]);
const out = {first: shown(), url: url};
if (input.choose) { select.value = input.choose; select.listeners.forEach(f => f()); out.chosen = shown(); out.url2 = url; }
console.log(JSON.stringify(out));
"""


class Flt(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements, self.options, self.select = [], [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "flt" in (attrs.get("class") or "").split():
            self.elements.append({k: v for k, v in attrs.items() if k.startswith("data-")})
        if tag == "select":
            self.select = attrs.get("id") == "f-protocol"
        if tag == "option" and self.select:
            self.options.append(attrs["value"])

    def handle_endtag(self, tag):
        if tag == "select":
            self.select = False


@pytest.mark.skipif(NODE is None, reason="no node on PATH")
def test_the_protocol_switch_script_shows_one_protocol_at_a_time(site, tmp_path):
    """The page's own script (templates/leaderboard.js) on the page's own elements, in node with a
    minimal DOM: on opening only the default protocol's tables show; #protocol=NAME and choosing an
    option show that protocol's; the choice is kept in the address's hash. (test_report_browser.py
    does the same in a real browser where Chromium is installed.)"""
    parsed = Flt()
    parsed.feed((site / "index.html").read_text())
    script = Path(__file__).resolve().parents[1] / "pflbench" / "reports" / "templates" / "leaderboard.js"
    (tmp_path / "shim.js").write_text(SHIM)

    def run(hash_, choose=None):
        (tmp_path / "in.json").write_text(
            json.dumps(
                {
                    "elements": parsed.elements,
                    "options": parsed.options,
                    "default": parsed.options[0],
                    "hash": hash_,
                    "choose": choose,
                }
            )
        )
        done = subprocess.run(
            [NODE, str(tmp_path / "shim.js"), str(tmp_path / "in.json"), str(script)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    opened = run("", choose="delivered-final-clients")  # opens on the paper's protocol (a Δ there)
    assert opened["first"] and set(opened["first"]) == {"adapted-final-clients"}
    assert set(opened["chosen"]) == {"delivered-final-clients"} and "protocol=delivered-final-clients" in opened["url2"]
    linked = run("#protocol=delivered-bestval-clients&scheme=pathological")
    assert set(linked["first"]) == {"delivered-bestval-clients"}
    unknown = run("#protocol=nonsense")  # an unknown protocol in a link falls back to the default
    assert set(unknown["first"]) == {"adapted-final-clients"}


# ---- every setting a reference declares must match (issue 29, item 6) ---------------------------------

ALL_SETTINGS = (
    "algorithm,dataset,partition,clients,participation,rounds,local_epochs,lr,samples_per_client,"
    "train_fraction,val_fraction,batch_size,momentum,weight_decay,model,mean\n"
    "fedavg,cifar10,pathological,10,1.0,3,1,0.01,600,0.7,0.0,32,0.0,0.0,cnn-bn,50.00\n"
)
MATCHING = dict(
    algorithm="fedavg",
    dataset="cifar10",
    accuracies=(0.6, 0.6),
    local_epochs=1,
    lr=0.01,
    samples_per_client=600,
    config={"val_fraction": 0.0, "train_fraction": 0.7, "batch_size": 32, "momentum": 0.0, "weight_decay": 0.0},
    summary={"model": "cnn-bn"},
)


def _one_entry(tmp_path, **changes):
    refs = tmp_path / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "all.csv").write_text("# source: Other (X), 2024\n# table: Table 9\n" + ALL_SETTINGS)
    kwargs = {**MATCHING, **changes}
    kwargs["config"] = {**MATCHING["config"], **changes.get("config", {})}
    write_cell(tmp_path / "s", **kwargs)
    (table,) = accuracy_tables(load_cells(tmp_path / "s"), load_references(refs))
    return table, entry(table, "fedavg")


def test_every_declared_setting_matching_gives_a_delta(tmp_path):
    table, fedavg = _one_entry(tmp_path)
    assert fedavg.comparable and fedavg.delta == pytest.approx(10.0) and not table.footnotes


@pytest.mark.parametrize(
    "changes, difference",
    [
        ({"config": {"train_fraction": 0.8}}, "train_fraction 0.8 vs 0.7"),
        ({"config": {"val_fraction": 0.1}}, "val_fraction 0.1 vs 0"),  # a validation carve-out the paper lacks
        ({"config": {"batch_size": 64}}, "batch_size 64 vs 32"),
        ({"config": {"momentum": 0.9}}, "momentum 0.9 vs 0"),
        ({"config": {"weight_decay": 0.0001}}, "weight_decay 0.0001 vs 0"),
        ({"summary": {"model": "cnn"}}, "model cnn vs cnn-bn"),  # the model `auto` resolved to
        ({"dataset": "cifar10-jpeg"}, "dataset cifar10-jpeg vs cifar10"),  # shown beside CIFAR-10, never compared
    ],
)
def test_a_mismatch_in_any_declared_setting_suppresses_the_delta_and_says_why(tmp_path, changes, difference):
    table, fedavg = _one_entry(tmp_path, **changes)
    assert fedavg.paper is not None and fedavg.paper.mean == 50.0  # still shown beside ours
    assert fedavg.delta is None and not fedavg.comparable
    assert table.footnotes[fedavg.footnote - 1] == f"settings differ (ours vs paper): {difference}"
    text = markdown_table(table)
    assert "+10.00" not in text and f"[{fedavg.footnote}]" in text
    lines = latex_report([table], [], [])
    assert difference.replace("_", r"\_") in lines


def test_the_model_is_compared_as_configured_when_the_summary_does_not_name_it(tmp_path):
    paper = PaperValue(50.0, None, None, "X", DEFAULT, (("model", "cnn"), ("batch_size", 32)))
    cells = pd.DataFrame({"model": ["cnn", "cnn-bn"], "resolved_model": [None, None], "batch_size": [32, 32]})
    assert setting_differences(paper, cells) == ("model cnn/cnn-bn vs cnn",)
    assert setting_differences(paper, cells.iloc[:1]) == ()


def test_pfedla_references_declare_the_papers_split_batch_and_model():
    refs = {r.name: r for r in load_references(default_reference_dir())}
    for name in ("pfedla_table1", "pfedla_table2", "pfedla_table3"):
        rows = refs[name].rows
        fomo = rows["algorithm"] == "fedfomo"  # FedFomo needs its own validation data: not constrained
        assert set(rows["train_fraction"]) == {0.7} and set(rows.loc[~fomo, "val_fraction"]) == {0.0}
        assert rows.loc[fomo, "val_fraction"].isna().all()
        assert set(rows["batch_size"]) == {32}
        assert dict(zip(rows["dataset"], rows["model"])) == {
            d: m
            for d, m in (("emnist", "cnn"), ("fmnist", "cnn"), ("cifar10", "cnn-bn"), ("cifar100", "cnn-bn"))
            if d in set(rows["dataset"])
        }
        assert "momentum" not in rows and "weight_decay" not in rows  # the paper says "SGD", nothing more


@pytest.mark.parametrize("table", ["table1", "table2"])
def test_full_scale_cells_match_every_setting_their_reference_declares(table):
    """The full-scale spec is the paper's protocol: every cell would get a Δ (issue 32's column depends on it);
    the quick scale never does."""
    from pflbench.simulator.models import default_model
    from pflbench.reports.reference import compare, find_paper_value
    from pflbench.run.spec import load_spec

    spec = Path(__file__).resolve().parents[1] / "benchmarks" / f"{table}.yaml"
    refs = [r for r in load_references(default_reference_dir()) if r.name == f"pfedla_{table}"]
    shapes = {
        "emnist": (1, 28, 28),
        "fmnist": (1, 28, 28),
        "cifar10": (3, 32, 32),
        "cifar100": (3, 32, 32),
        "cifar10-jpeg": (3, 32, 32),
    }
    for scale, comparable in (("full", True), ("quick", False)):
        compared = 0
        for cell in load_spec(spec, scale=scale).cells:
            row = pd.json_normalize(cell.model_dump(), sep=".").iloc[0]
            row["resolved_model"] = default_model(shapes[cell.dataset]) if cell.model == "auto" else cell.model
            cells = pd.DataFrame([row])
            dataset = "cifar10" if cell.dataset == "cifar10-jpeg" else cell.dataset
            paper = find_paper_value(
                refs,
                algorithm=cell.algorithm,
                dataset=dataset,
                partition=cell.partition,
                clients=cell.clients,
                cells=cells,
            )
            if paper is None:  # FedBN on EMNIST / FashionMNIST: "-" in the paper
                assert cell.algorithm == "fedbn" and cell.dataset in ("emnist", "fmnist")
                continue
            assert compare(paper, cells, ADAPTED).comparable is comparable, (scale, cell)
            compared += 1
        assert compared >= 36
