"""`pflbench new algorithm NAME [--from fedavg|fedprox|fedper|ditto]` and `pflbench new partition NAME`:
a documented starting file for the user's own method or non-IID scheme, and a pytest file that runs
it on the generated dataset. The file is a plugin (pflbench/loader/plugins.py): `--plugin FILE` or a spec's
`plugins:` puts it beside the built-ins. The templates are in pflbench/cli/templates.

The written algorithm extends FedAvg (`pflbench.fedavg.FedAvg`) and overrides only the hooks its
starting point changes from it, declares the state it adds for checkpoints, imports exactly the names it uses
and is typed (it passes the repository's `ruff check` and `mypy`: its hyperparameters are a module-level class
`<Class>HP`, `class <Class>(FedAvg[<Class>HP])`), and is named as
the user spells it: `new algorithm FedAvgM` registers `fedavgm`, class FedAvgM, shown as FedAvgM; a
lowercase name takes the built-ins' spelling of its words (fedavgm: FedAvgM); `--display-name` sets it.

Only the standard library is imported here (every `pflbench --help` builds this parser).
"""

from __future__ import annotations

import argparse
import json
import keyword
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).parent / "templates"
# The built-ins' folders: every module in them is imported as a built-in (a written test file too), so the
# scaffold's plugin and test go elsewhere; a built-in is added by hand (pflbench/algorithms/README.md).
BUILTIN_FOLDERS = {
    Path(__file__).resolve().parents[1] / "algorithms": "algorithms",
    Path(__file__).resolve().parents[1] / "partitions": "partition schemes",
}
# Registered in lowercase, like the built-ins (fedavg, lg-fedavg, mh-pfedhn): FedAvgM is registered as fedavgm.
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*$")


@dataclass(frozen=True)
class Base:
    """A built-in method a new algorithm may start from, written out (not subclassed) so it can be
    edited: the hooks in which it differs from FedAvg (`pflbench.fedavg.FedAvg`, which the
    written class extends)."""

    text: str  # what the starting point does, for the file's docstring
    personalizes: str
    hyperparams: str  # the body of the module-level hyperparameters class (`<Class>HP(Hyperparams)`)
    search_space: str
    body: str  # the hooks it overrides (none for FedAvg: the written class extends FedAvg)
    api: tuple[str, ...] = ()  # more names from pflbench.algorithm that the hooks' signatures use
    training: tuple[str, ...] = ()  # names from pflbench.simulator.training that the hooks use
    torch: tuple[str, ...] = ()  # names from torch that the hooks use


BASES = {
    "fedavg": Base(
        text="FedAvg: clients train the global model locally, the server averages the results weighted by "
        "each client's training samples (FedAvg's hooks, which the class extends: none is written out)",
        personalizes="nothing yet: one global model (FedAvg)",
        hyperparams="    # none yet; e.g. momentum: float = Field(0.9, ge=0.0, lt=1.0)  (from pydantic import Field)",
        search_space='{}  # e.g. {"momentum": ("uniform", 0.0, 0.99)}',
        body="""
    # The hooks are FedAvg's (pflbench/fedavg.py): override only those your method changes.
    # E.g. a server step of its own, from FedAvg's average of the uploads that arrived:
    #
    #     def aggregate(self, rnd: ClientRound, upload: Payload) -> None:  # both from pflbench.algorithm
    #         average = self.weighted_mean(upload)  # {tensor name: [1, ...]}, weighted by training samples
    #         self.global_state.update(average)     # FedAvg's step; yours goes from self.global_state
    #
    # State a round changes goes in an attribute declared for checkpoints (pflbench/algorithm.py):
    #     state = (*FedAvg.state, "velocity")   # and, in setup(), self.velocity = ... after super().setup()
""",
    ),
    "fedprox": Base(
        text="FedProx: FedAvg whose local objective adds mu/2 * ||w - w_global||^2 against client drift",
        personalizes="nothing yet: one global model, trained with a proximal term (FedProx)",
        hyperparams="    mu: float = Field(0.01, ge=0.0)  # weight of the proximal term",
        search_space='{"mu": ("loguniform", 1e-3, 1.0)}',
        api=("ClientRound",),
        training=("State", "cross_entropy"),
        torch=("Tensor",),
        body='''
    def local_train(self, rnd: ClientRound, state: State) -> State:
        """Client: local SGD on cross-entropy + mu/2 * ||w - w_global||^2 (w_global: the model
        downloaded this round). The objective is computed per client: params[n] is [clients, ...]."""
        mu = self.hp.mu
        names = self.engine.model.param_names
        # The downloaded model rides along as `aux`, stacked like the state (one row per client).
        anchor = {f"global.{n}": state[n].detach().clone() for n in names}

        def objective(logits: Tensor, labels: Tensor, params: State, aux: State) -> Tensor:
            prox = sum(((params[n] - aux[f"global.{n}"]) ** 2).flatten(1).sum(1) for n in names)
            return cross_entropy(logits, labels, params, aux) + 0.5 * mu * prox

        return self.engine.train(rnd, rnd.clients, state, objective=objective, aux=anchor).state
''',
    ),
    "fedper": Base(
        text="FedPer: the top layers are each client's own (never sent); the base is averaged as in FedAvg",
        personalizes="the top `personal_layers` layers (default: the classifier); the base is FedAvg",
        hyperparams="    personal_layers: int = Field(1, ge=0)  # layers, from the top, that stay on the client",
        search_space='{"personal_layers": ("choice", [1, 2, 3])}',
        body='''
    # Checkpoints: FedAvg's models (`state`, inherited); the personal tensors are rebuilt from the
    # hyperparameters by setup(), not saved.
    state_rebuilt = ("_personal",)

    def setup(self) -> None:
        """Server and client state (every client starts from the same model); which tensors are personal."""
        super().setup()
        _, self._personal = self.engine.model.split_layers(self.hp.personal_layers)

    def is_local(self, name: str) -> bool:
        """Whether the tensor `name` stays on the client: never sent, never averaged. FedAvg then keeps
        each client's own copy and evaluates the global rest with it."""
        return name in self._personal
''',
    ),
    "ditto": Base(
        text="Ditto: FedAvg for the global model, plus one personal model per client trained on its own "
        "loss + lam/2 * ||v - w_global||^2 (never sent; the model each client is scored with)",
        personalizes="a whole personal model per client, pulled toward the FedAvg global model (Ditto)",
        hyperparams="    lam: float = Field(1.0, ge=0.0)  # lambda of the proximal term (0: local training)\n"
        "    personal_epochs: int | None = Field(None, ge=1)  # None: the cell's local_epochs",
        search_space='{"lam": ("loguniform", 1e-3, 10.0), "personal_epochs": ("int", 1, 5)}',
        api=("ClientRound",),
        training=("State", "cross_entropy"),
        torch=("Tensor",),
        body='''
    # The batch order of the personal model's training: a stream of its own (a name), so that the global
    # copy keeps the engine's default order ("batches") and is FedAvg's model.
    PERSONAL_STREAM = "batches.$name.personal"
    # Checkpoints: FedAvg's models and every client's personal model (what rounds change).
    state = (*FedAvg.state, "personal_state")

    def setup(self) -> None:
        """FedAvg's models; then every client's personal model v_k [N, ...], from the same initial model."""
        super().setup()
        self.personal_state = self.engine.init_state(self.engine.num_clients)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        """Client: FedAvg's local training of the downloaded model w (what is sent), then the personal
        models' training on cross-entropy + lam/2 * ||v - w||^2 (objective per client: [clients, ...])."""
        clients = rnd.clients
        names = self.engine.model.param_names
        # w: the downloaded global model, the anchor of the personal objective (rides along as `aux`).
        anchor = {f"global.{n}": state[n].detach().clone() for n in names}
        global_update = self.engine.train(rnd, clients, state).state
        lam = self.hp.lam

        def objective(logits: Tensor, labels: Tensor, params: State, aux: State) -> Tensor:
            prox = sum(((params[n] - aux[f"global.{n}"]) ** 2).flatten(1).sum(1) for n in names)
            return cross_entropy(logits, labels, params, aux) + 0.5 * lam * prox

        personal = {n: t[clients] for n, t in self.personal_state.items()}
        personal = self.engine.train(rnd, clients, personal, objective=objective, aux=anchor,
                                  epochs=self.hp.personal_epochs, stream=self.PERSONAL_STREAM).state
        for n, t in personal.items():
            self.personal_state[n][clients] = t
        return global_update

    def personalized(self) -> State:
        """The model each client is scored with: its personal model."""
        return self.personal_state
''',
    ),
}

# What every written algorithm imports from pflbench.algorithm, and the base it extends (a class named like an
# import is refused).
ALGORITHM_API = ("ALGORITHMS", "Capabilities", "Card", "Hyperparams")
BASE_CLASS = "FedAvg"  # from pflbench.fedavg


def imports_of(base: Base) -> str:
    """The written file's imports: exactly the names it uses (so the repository's `ruff check` passes)."""
    lines = []
    if any("Field(" in line.split("#")[0] for line in base.hyperparams.splitlines()):
        lines.append("from pydantic import Field")
    if base.torch:
        lines.append(f"from torch import {', '.join(base.torch)}")
    if lines:
        lines.append("")
    names = sorted(ALGORITHM_API + base.api, key=lambda name: (not name.isupper(), name))  # as isort orders them
    lines.append(f"from pflbench.algorithm import {', '.join(names)}")
    lines.append(f"from pflbench.fedavg import {BASE_CLASS}")
    if base.training:
        lines.append(f"from pflbench.simulator.training import {', '.join(base.training)}")
    return "\n".join(lines)


class ScaffoldError(ValueError):
    pass


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    new = subparsers.add_parser(
        "new", help="write a documented starting file (and its test) for your own algorithm or partition scheme"
    )
    kinds = new.add_subparsers(dest="new_kind", required=True, metavar="KIND")
    algorithm = kinds.add_parser("algorithm", help="a new algorithm: NAME.py (a plugin) and test_NAME.py")
    algorithm.add_argument(
        "name",
        help="its name as reports show it (FedAvgM) or in lowercase (fedavgm): letters, "
        "digits and dashes; it is registered in lowercase",
    )
    algorithm.add_argument(
        "--from",
        dest="base",
        choices=sorted(BASES),
        default="fedavg",
        help="the method written out as the starting point (default: fedavg)",
    )
    partition = kinds.add_parser("partition", help="a new non-IID scheme: NAME.py (a plugin) and test_NAME.py")
    partition.add_argument("name", help="its name: letters, digits and dashes; it is registered in lowercase")
    for parser in (algorithm, partition):
        parser.add_argument(
            "--display-name",
            help="how reports show it (default: NAME as spelled; an algorithm's "
            "lowercase NAME in the built-ins' spelling, fedavgm: FedAvgM)",
        )
        parser.add_argument("--out", type=Path, default=Path("."), help="folder to write into (default: here)")
        parser.add_argument("--force", action="store_true", help="overwrite files that exist")
    new.set_defaults(func=cmd_new)


def cmd_new(args: argparse.Namespace) -> int:
    try:
        written = write_scaffold(
            args.new_kind,
            args.name,
            args.out,
            base=getattr(args, "base", "fedavg"),
            force=args.force,
            display_name=args.display_name,
        )
    except ScaffoldError as error:
        print(f"new {args.new_kind}: {error}", file=sys.stderr)
        return 2
    plugin, test = written
    name = args.name.lower()
    print(f"written: {plugin}, {test}")
    print(f"next: edit {plugin.name}; check it with `pytest {test}`; then (docs/howto/own-method.md)")
    if args.new_kind == "algorithm":
        print(f"  {try_command(plugin, name)}   # against FedAvg, about a minute")
    else:
        print(f"  pflbench run SPEC --plugin {plugin} --set partition={name}")
    return 0


def try_command(plugin: Path | str, name: str) -> str:
    """A new algorithm's first run: the shipped spec benchmarks/quickstart.yaml (FedAvg on generated data,
    3 seeds, about a minute on 2 cores) with the method added."""
    return f"pflbench run quickstart --plugin {plugin} --set 'algorithm+=[{name}]' --no-ray"


def identifiers(name: str, kind: str = "algorithm", display_name: str | None = None) -> dict[str, str]:
    """The registered name (`name` in lowercase), the files, the display name (`display_name`; else
    `name` as spelled where it has capitals; else, for an algorithm, in the built-ins' spelling:
    fedavgm -> FedAvgM, lg-fedavgm -> LGFedAvgM) and the class name (the display name as an identifier)."""
    registered = name.lower()
    stem = registered.replace("-", "_")
    parts = registered.split("-")
    if display_name is None or not display_name.strip():
        if name != registered:
            display_name = name
        elif kind == "algorithm":
            words = known_spellings()
            display_name = "".join(spelled(part, words) for part in parts)
        else:
            display_name = "".join(part.capitalize() for part in parts)
    display_name = display_name.strip()
    class_name = "".join(word[:1].upper() + word[1:] for word in re.split(r"\W+", display_name) if word)
    if not class_name.isidentifier() or keyword.iskeyword(class_name):
        class_name = "".join(part.capitalize() for part in parts)
    return {
        "name": registered,
        "module_file": f"{stem}.py",
        "test_file": f"test_{stem}.py",
        "class_name": class_name,
        "display_name": display_name,
        # in the written code: a Python string literal; in its docstrings: text that cannot end them
        "display_literal": json.dumps(display_name, ensure_ascii=False),
        "display_text": display_name.replace('"', "'").replace("\\", "/"),
    }


def known_spellings() -> dict[str, str]:
    """lowercase -> spelling of the words in the registered algorithms' display names that are not just
    capitalized (FedAvg, pFedHN, LG, APFL; not Local or Per): how a lowercase name's words are spelled."""
    from pflbench.algorithm import ALGORITHMS

    words: dict[str, str] = {}
    for _, cls in ALGORITHMS.items():
        for word in re.split(r"[^0-9A-Za-z]+", cls.card.display_name):
            if word != word.capitalize():
                words.setdefault(word.lower(), word)
    return words


def spelled(part: str, words: dict[str, str]) -> str:
    """A lowercase word in the built-ins' spelling: its longest known prefix (of 3 letters or more, or the
    whole word) as spelled there, the rest likewise, an unknown rest capitalized (fedavgm -> FedAvgM)."""
    out = ""
    while part:
        known = [w for w in words if part.startswith(w) and (len(w) >= 3 or w == part)]
        if not known:
            return out + part[:1].upper() + part[1:]
        word = max(known, key=len)
        out, part = out + words[word], part[len(word) :]
    return out


def check_name(kind: str, name: str) -> None:
    if not NAME.match(name):
        raise ScaffoldError(
            f"name {name!r} is not allowed: letters, digits and single dashes, starting with a "
            f"letter (e.g. my-avg, or FedAvgM: registered as fedavgm, shown as FedAvgM)"
        )
    from pflbench.loader.plugins import load_builtins, registries

    load_builtins()
    registry = registries()[kind]
    name = name.lower()
    if name in registry:
        who = registry.origin(name)
        raise ScaffoldError(
            f"{registry.kind} {name!r} already exists ({'built-in' if who is None else 'plugin ' + who}); "
            f"choose another name (taken: {', '.join(registry.names())})"
        )


def write_scaffold(
    kind: str, name: str, out: Path, base: str = "fedavg", force: bool = False, display_name: str | None = None
) -> tuple[Path, Path]:
    """Write the plugin file and its test into `out`; (plugin path, test path)."""
    if kind not in ("algorithm", "partition"):
        raise ScaffoldError(f"unknown kind {kind!r}; allowed: algorithm, partition")
    if kind == "algorithm" and base not in BASES:
        raise ScaffoldError(f"--from {base!r} is not a starting point; allowed: {', '.join(sorted(BASES))}")
    builtins = BUILTIN_FOLDERS.get(Path(out).resolve())
    if builtins is not None:
        raise ScaffoldError(
            f"{out} is the folder of pflbench's built-in {builtins}, where every module is imported "
            f"as one; write the plugin and its test into a folder of your own (--out, default: here), "
            f"or add a built-in by hand (pflbench/algorithms/README.md)"
        )
    check_name(kind, name)
    values = identifiers(name, kind, display_name)
    plugin, test = Path(out) / values["module_file"], Path(out) / values["test_file"]
    existing = [str(p) for p in (plugin, test) if p.exists()]
    if existing and not force:
        raise ScaffoldError(f"{', '.join(existing)} exists; nothing was written (--force overwrites)")
    if kind == "algorithm":
        chosen = BASES[base]
        hp_class = values["class_name"] + "HP"
        imported = (*ALGORITHM_API, BASE_CLASS, *chosen.api, *chosen.training, *chosen.torch, "Field")
        if values["class_name"] in imported or hp_class in imported:
            raise ScaffoldError(
                f"the class {values['class_name']} would hide a name it imports; choose another name or --display-name"
            )
        values.update(
            base=base,
            base_text=textwrap.fill(chosen.text, 104),
            personalizes=chosen.personalizes,
            hp_class=hp_class,
            hyperparams=chosen.hyperparams,
            search_space=chosen.search_space,
            imports=imports_of(chosen),
            body=Template(chosen.body).safe_substitute(name=values["name"]),
            try_command=try_command(values["module_file"], values["name"]),
        )
    Path(out).mkdir(parents=True, exist_ok=True)
    plugin.write_text(Template((TEMPLATES / f"{kind}.py.tmpl").read_text()).substitute(values))
    test.write_text(Template((TEMPLATES / f"{kind}_test.py.tmpl").read_text()).substitute(values))
    return plugin, test
