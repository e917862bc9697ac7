"""`pflbench new algorithm NAME [--from fedavg|fedprox|fedper]` and `pflbench new partition NAME`:
a documented starting file for the user's own method or non-IID scheme, and a pytest file that runs
it on the generated dataset. The file is a plugin (pflbench/plugins.py): `--plugin FILE` or a spec's
`plugins:` puts it beside the built-ins. The templates are in pflbench/scaffold_templates/.

Only the standard library is imported here (every `pflbench --help` builds this parser).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).parent / "scaffold_templates"
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")  # like the built-ins: fedavg, lg-fedavg, mh-pfedhn


@dataclass(frozen=True)
class Base:
    """A built-in method a new algorithm may start from, written out (not subclassed) so it can be edited."""

    text: str           # what the starting point does, for the file's docstring
    personalizes: str
    hyperparams: str    # the Hyperparams class body
    search_space: str
    imports: str
    body: str           # the hooks, overridden with the base method's behaviour
    api: str = ""       # more names from pflbench.algorithm the hooks' signatures use


BASES = {
    "fedavg": Base(
        text="FedAvg: clients train the global model locally, the server averages the results weighted by "
             "each client's training samples",
        personalizes="nothing yet: one global model (FedAvg)",
        hyperparams="        pass  # e.g. strength: float = Field(0.1, ge=0.0)",
        search_space="{}  # e.g. {\"strength\": (\"loguniform\", 1e-3, 1.0)}",
        imports="from pflbench.training import State, weighted_mean\n",
        api=", Payload, Round",
        body='''
    def local_train(self, rnd: Round, state: State) -> State:
        """Client: local SGD of the round's sampled clients (`rnd.clients`); `state` holds their models
        stacked [clients, ...]. `self.fed.train` runs the cell's local epochs (batched across clients);
        given the round `rnd`, a straggler does only its share (the system knob). `objective=` replaces
        the loss (see `--from fedprox`)."""
        return self.fed.train(rnd, rnd.clients, state).state

    def aggregate(self, rnd: Round, upload: Payload) -> None:
        """Server: the uploads that reached it (`upload.clients`; under system.dropout some are lost),
        averaged, weighted by each client's training samples (FedAvg)."""
        weights = self.fed.train_sizes[upload.clients].float()
        weights = weights / weights.sum()
        for n, t in upload.state.items():
            self.global_state[n] = weighted_mean(t, weights).unsqueeze(0)
'''),
    "fedprox": Base(
        text="FedProx: FedAvg whose local objective adds mu/2 * ||w - w_global||^2 against client drift",
        personalizes="nothing yet: one global model, trained with a proximal term (FedProx)",
        hyperparams="        mu: float = Field(0.01, ge=0.0)  # weight of the proximal term",
        search_space="{\"mu\": (\"loguniform\", 1e-3, 1.0)}",
        imports="from pflbench.training import State, cross_entropy\n",
        api=", Round",
        body='''
    def local_train(self, rnd: Round, state: State) -> State:
        """Client: local SGD on cross-entropy + mu/2 * ||w - w_global||^2 (w_global: the model
        downloaded this round). The objective is computed per client: params[n] is [clients, ...]."""
        mu = float(self.hp.mu)
        names = self.fed.model.param_names
        # The downloaded model rides along as `aux`, stacked like the state (one row per client).
        anchor = {f"global.{n}": state[n].detach().clone() for n in names}

        def objective(logits, labels, params, aux):
            prox = sum(((params[n] - aux[f"global.{n}"]) ** 2).flatten(1).sum(1) for n in names)
            return cross_entropy(logits, labels, params, aux) + 0.5 * mu * prox

        return self.fed.train(rnd, rnd.clients, state, objective=objective, aux=anchor).state
'''),
    "fedper": Base(
        text="FedPer: the top layers are each client's own (never sent); the base is averaged as in FedAvg",
        personalizes="the top `personal_layers` layers (default: the classifier); the base is FedAvg",
        hyperparams="        personal_layers: int = Field(1, ge=0)  # layers, from the top, that stay on the client",
        search_space="{\"personal_layers\": (\"choice\", [1, 2, 3])}",
        imports="",
        body='''
    def setup(self) -> None:
        """Server and client state (every client starts from the same model); which tensors are personal."""
        super().setup()
        _, self._personal = self.fed.model.split_layers(self.hp.personal_layers)

    def is_local(self, name: str) -> bool:
        """Whether the tensor `name` stays on the client: never sent, never averaged. The base class
        then keeps each client's own copy and evaluates the global rest with it."""
        return name in self._personal
'''),
}


class ScaffoldError(ValueError):
    pass


def add_parser(subparsers) -> None:
    new = subparsers.add_parser("new", help="write a documented starting file (and its test) for your own "
                                            "algorithm or partition scheme")
    kinds = new.add_subparsers(dest="new_kind", required=True, metavar="KIND")
    algorithm = kinds.add_parser("algorithm", help="a new algorithm: NAME.py (a plugin) and test_NAME.py")
    algorithm.add_argument("name", help="its registered name: lowercase letters, digits and dashes (e.g. my-avg)")
    algorithm.add_argument("--from", dest="base", choices=sorted(BASES), default="fedavg",
                           help="the method written out as the starting point (default: fedavg)")
    partition = kinds.add_parser("partition", help="a new non-IID scheme: NAME.py (a plugin) and test_NAME.py")
    partition.add_argument("name", help="its registered name: lowercase letters, digits and dashes")
    for parser in (algorithm, partition):
        parser.add_argument("--out", type=Path, default=Path("."), help="folder to write into (default: here)")
        parser.add_argument("--force", action="store_true", help="overwrite files that exist")
    new.set_defaults(func=cmd_new)


def cmd_new(args) -> int:
    try:
        written = write_scaffold(args.new_kind, args.name, args.out, base=getattr(args, "base", "fedavg"),
                                 force=args.force)
    except ScaffoldError as error:
        print(f"new {args.new_kind}: {error}", file=sys.stderr)
        return 2
    plugin, test = written
    print(f"written: {plugin}, {test}")
    print(f"next: edit {plugin.name}; check it with `pytest {test}`; then (docs/howto/own-method.md)")
    if args.new_kind == "algorithm":
        print(f"  pflbench run table1 --scale quick --plugin {plugin} --set 'algorithm+=[{args.name}]'")
    else:
        print(f"  pflbench run SPEC --plugin {plugin} --set partition={args.name}")
    return 0


def identifiers(name: str) -> dict[str, str]:
    stem = name.replace("-", "_")
    return {"name": name, "module_file": f"{stem}.py", "test_file": f"test_{stem}.py",
            "class_name": "".join(part.capitalize() for part in re.split(r"[-_]", name)),
            "display_name": "".join(part.capitalize() for part in re.split(r"[-_]", name))}


def check_name(kind: str, name: str) -> None:
    if not NAME.match(name):
        raise ScaffoldError(f"name {name!r} is not allowed: lowercase letters, digits and single dashes, starting "
                            f"with a letter (e.g. my-avg)")
    from pflbench.plugins import load_builtins, registries

    load_builtins()
    registry = registries()[kind]
    if name in registry:
        who = registry.origin(name)
        raise ScaffoldError(f"{registry.kind} {name!r} already exists ({'built-in' if who is None else 'plugin ' + who}); "
                            f"choose another name (taken: {', '.join(registry.names())})")


def write_scaffold(kind: str, name: str, out: Path, base: str = "fedavg", force: bool = False) -> tuple[Path, Path]:
    """Write the plugin file and its test into `out`; (plugin path, test path)."""
    if kind not in ("algorithm", "partition"):
        raise ScaffoldError(f"unknown kind {kind!r}; allowed: algorithm, partition")
    if kind == "algorithm" and base not in BASES:
        raise ScaffoldError(f"--from {base!r} is not a starting point; allowed: {', '.join(sorted(BASES))}")
    check_name(kind, name)
    values = identifiers(name)
    plugin, test = Path(out) / values["module_file"], Path(out) / values["test_file"]
    existing = [str(p) for p in (plugin, test) if p.exists()]
    if existing and not force:
        raise ScaffoldError(f"{', '.join(existing)} exists; nothing was written (--force overwrites)")
    if kind == "algorithm":
        chosen = BASES[base]
        values.update(base=base, base_text=chosen.text, personalizes=chosen.personalizes,
                      hyperparams=chosen.hyperparams, search_space=chosen.search_space, imports=chosen.imports,
                      body=chosen.body, api=chosen.api)
    Path(out).mkdir(parents=True, exist_ok=True)
    plugin.write_text(Template((TEMPLATES / f"{kind}.py.tmpl").read_text()).substitute(values))
    test.write_text(Template((TEMPLATES / f"{kind}_test.py.tmpl").read_text()).substitute(values))
    return plugin, test
