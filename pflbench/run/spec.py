"""Experiment specs: one YAML file declares a matrix of cells; this module validates it and expands it
into fully resolved `CellConfig`s (the format is documented in benchmarks/README.md).

A value reaches a cell from, in increasing precedence: `defaults`, the cell's `matrix` entries, the
`overrides` whose `when` matches (in file order, each seeing the earlier ones' effect), and `--set`.
Internally every source is a flat map `key -> value` where a key is a cell field (`lr`) or an entry
of one of its dict fields (`partition_params.alpha`, `dataset_options.num_samples`, `hp.mu`), so
merging is a dict update and every value remembers where it was written, for error messages.

Everything is checked before anything runs, and all problems are reported together in one
`SpecError`, each naming the file, the field (`matrix.dataset[1]`, `overrides[0].set.lr`,
`--set rounds`), the bad value and what is allowed.

A spec may also declare `scales` (named variants, e.g. `quick`: replaced matrix axes, more defaults and
overrides, other resources; chosen with `pflbench run --scale NAME`; `full` is the spec as written)
and `tuned` (use the sweeps' best configurations, benchmarks/tuned/<algo>.yaml). With both, the
precedence is: defaults, the scale's defaults, matrix entries (the scale's axes replace the spec's),
the spec's overrides, the scale's overrides, tuned configurations, `--set`.

    plan = load_spec("benchmarks/demo.yaml", parse_sets(["rounds=2"]))   # or parse_spec(dict)
    plan.cells, plan.resources, plan.optional_datasets
    cell = resolve_cell({"algorithm": "fedprox", "dataset": "synthetic", "hp": {"mu": 0.1}})  # one cell
"""

from __future__ import annotations

import difflib
import itertools
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from collections.abc import Iterator
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BeforeValidator, TypeAdapter, ValidationError

from pflbench.config import CellConfig, reject_boolean
from pflbench.registry import echo, unknown_message  # noqa: F401  (unknown_message: used by others via spec)
from pflbench.run.spec_schema import (
    AXIS_TYPES,
    NAME_CHECKS,
    VARIANTS_AXIS,
    VARIANTS_TYPE,
    Resources,
    Scale,
    SpecFile,
    TunedFile,
    TunedSetting,
    _listify,
    hyperparameters,
)

# Dict-valued cell fields: their entries are addressed as `field.entry`.
DICT_FIELDS = ("dataset_options", "partition_params", "hp", "feature_shift", "concept_shift", "system", "privacy")
# Matrix axes with their own entry syntax; every other settable key can be an axis of plain values.
STRUCTURED_AXES = ("algorithm", "dataset", "partition", "clients")
SPEC_KEYS = (
    "name",
    "description",
    "plugins",
    "matrix",
    "defaults",
    "overrides",
    "resources",
    "scales",
    "tuned",
    "trackers",
)
VARIANT_SELECTOR = "variant"  # `--set variant=NAME`: one entry of the variants axis, by its name
CLIENTS_AXIS = "clients"  # `--set clients=N` picks the axis's entries for N clients (participation and all)
FULL_SCALE = "full"  # the spec as written; every other scale is a block under `scales:`
TUNED_DIR = "tuned"  # default folder of tuned configurations, next to the spec file (benchmarks/tuned)


class SpecError(ValueError):
    """A spec that cannot run: every problem, one per line, each naming its file and field."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [_shortened(f"{source}: {where}: {message}") for where, message in problems]
        header = f"invalid spec {source} ({len(problems)} problems):\n  " if len(problems) > 1 else ""
        super().__init__(header + "\n  ".join(lines))


MAX_MESSAGE = 2000  # a last guard on any one problem line
MAX_SPEC_VALUES = 100_000  # entries a spec (or a --set value) may expand to; real specs have a few hundred


def _shortened(line: str) -> str:
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE] + f"... ({len(line):,} characters, shortened)"


def count_values(data: Any, limit: int = MAX_SPEC_VALUES) -> int:
    """Scalars, lists and mappings in `data`, counted as YAML's aliases expand them; stops past `limit`
    (a 300-byte "billion laughs" file expands to millions of entries but costs nothing to count this way)."""
    stack, count = [data], 0
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count


def _check_size(data: Any, source: str, where: str) -> None:
    if count_values(data) > MAX_SPEC_VALUES:
        raise SpecError(
            source,
            [
                (
                    where,
                    f"expands to more than {MAX_SPEC_VALUES:,} values (YAML anchors and "
                    f"aliases repeated?); a spec is a few hundred settings at most",
                )
            ],
        )


# ---- values of cell fields -----------------------------------------------------------------------


@cache
def _field_type(key: str) -> TypeAdapter:
    """Validator of one settable key: the CellConfig field's type and bounds (pydantic's lax mode, so
    that `1e-3`, which YAML reads as a string, is a float), plus the registry check for names.
    Entries of dict fields are checked per cell, in context."""
    if "." in key:
        return TypeAdapter(Any)
    field = CellConfig.model_fields[key]
    extras = [*field.metadata, *([AfterValidator(NAME_CHECKS[key])] if key in NAME_CHECKS else [])]
    if field.annotation in (int, float):
        extras.insert(0, BeforeValidator(reject_boolean))
    return TypeAdapter(Annotated[(field.annotation, *extras)] if extras else field.annotation)


def _settable(key: str) -> str | None:
    """None if `key` may be assigned, else why not."""
    group, dot, entry = key.partition(".")
    fields = list(CellConfig.model_fields)
    if dot:
        if group not in DICT_FIELDS:
            return unknown_message("field with entries", group, list(DICT_FIELDS))
        return None if entry else f"missing the entry name after {group!r}."
    if key not in fields:
        return unknown_message("key", key, [*fields, *(f"{g}.NAME" for g in DICT_FIELDS)])
    return None


@dataclass(frozen=True)
class Assigned:
    value: Any
    origin: str  # where the value was written, e.g. "overrides[0].set.lr"


Assignments = dict[str, Assigned]
Axes = list[tuple[str, list[Assignments]]]  # matrix axes in file order: (key, its entries)


class Problems:
    """Collects (where, message) pairs, without repeats, in the order found."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], None] = {}

    def add(self, where: str, message: str) -> None:
        self.items[(where, message)] = None

    def add_validation(self, where: str, error: ValidationError) -> None:
        for e in error.errors(include_url=False):
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
            if e["type"] == "value_error":
                message = str(e["ctx"]["error"])
            else:
                message = f"{e['msg']} (got {echo(e['input'])})"
            self.add(where + loc, message)

    def check(self, adapter: TypeAdapter[Any], value: Any, where: str) -> Any:
        """`value` validated by `adapter`; None (and a problem) when it is not valid."""
        try:
            return adapter.validate_python(value)
        except ValidationError as error:
            self.add_validation(where, error)
            return None

    def __bool__(self) -> bool:
        return bool(self.items)


def _assignments_of(mapping: dict[str, Any], where: str, problems: Problems) -> Assignments:
    """`{lr: 0.1, hp: {mu: 1}, partition_params.alpha: 0.3}` -> checked flat assignments."""
    flat: Assignments = {}
    for key, value in mapping.items():
        key = str(key)
        if key in DICT_FIELDS:
            if not isinstance(value, dict):
                problems.add(f"{where}.{key}", f"must be a mapping of entries, got {echo(value)}")
                continue
            flat.update(_assignments_of({f"{key}.{k}": v for k, v in value.items()}, where, problems))
            continue
        origin = f"--set {key}" if where == "--set" else f"{where}.{key}"
        reason = _settable(key)
        if reason:
            problems.add(origin, reason)
            continue
        checked = problems.check(_field_type(key), value, origin)
        if checked is not None or value is None:
            flat[key] = Assigned(checked, origin)
    return flat


# ---- conditions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """`when:` of an override: every key must match; a list means any of its values. It sees the
    values written so far (a cell field not written has CellConfig's default; an entry of a dict
    field not written, such as a scheme's default parameter, is None)."""

    values: dict[str, tuple]

    def matches(self, flat: Assignments) -> bool:
        for key, allowed in self.values.items():
            if key in flat:
                current = flat[key].value
            else:
                field = CellConfig.model_fields.get(key)
                current = field.get_default(call_default_factory=True) if field is not None else None
            if current not in allowed:
                return False
        return True


def _condition_of(when: dict[str, Any], where: str, problems: Problems) -> Condition:
    values = {}
    for key, wanted in when.items():
        key = str(key)
        if key in DICT_FIELDS:
            problems.add(f"{where}.{key}", f"compare single entries, e.g. {key}.NAME: VALUE")
            continue
        reason = _settable(key)
        if reason:
            problems.add(f"{where}.{key}", reason)
            continue
        options = _listify(wanted)
        checked = [
            problems.check(_field_type(key), v, f"{where}.{key}" + (f"[{i}]" if len(options) > 1 else ""))
            for i, v in enumerate(options)
        ]
        values[key] = tuple(checked)
    return Condition(values)


# ---- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A validated, expanded spec: the cells to run and how to run them."""

    name: str
    source: str
    description: str
    cells: list[CellConfig]
    resources: Resources
    optional_datasets: frozenset[str]  # datasets whose cells are skipped where they cannot be loaded
    scale: str = FULL_SCALE
    scales: tuple[str, ...] = (FULL_SCALE,)  # every scale the spec offers
    tuned: dict[str, str] = field(default_factory=dict)  # algorithm -> the tuned file its cells use
    variants: tuple[str, ...] = ()  # the names of the `variants` axis (`--set variant=NAME` picks one)
    trackers: tuple[str, ...] = ()  # the spec's `trackers:` (pflbench/run/trackers.py); `--tracker` adds more


@dataclass(frozen=True)
class Rule:
    condition: Condition
    assignments: Assignments
    unless: Condition | None = None  # an override's `unless:`: the cells it leaves alone

    def applies(self, flat: Assignments) -> bool:
        return self.condition.matches(flat) and not (self.unless is not None and self.unless.matches(flat))


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` items; values are YAML, as in a spec file: 2, 1e-3, [0, 1], [fedavg, local]."""
    sets = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SpecError("--set", [(item, "expected KEY=VALUE")])
        try:
            sets[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError:
            sets[key.strip()] = text
        _check_size(sets[key.strip()], "--set", echo(key.strip()))
    return sets


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key written twice in one mapping is an error (YAML keeps
    the last one silently, so a spec would run something else than what it seems to say)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hashable = key in seen
            except TypeError:
                continue  # an unhashable key: SafeLoader reports it itself
            if hashable:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {str(key)[:80]!r} appears twice in one mapping (first on line "
                    f"{seen[key] + 1}); a spec must say each thing once",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str) -> Any:
    """A spec's YAML, with duplicate keys refused (see `_UniqueKeyLoader`)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def load_spec(path: str | Path, sets: dict[str, Any] | None = None, scale: str | None = None) -> Plan:
    """Read, validate and expand a spec file; `sets` are `--set key=value` overrides, `scale` one of
    the spec's `scales` (None or "full": the spec as written)."""
    path = Path(path)
    if not path.is_file():
        from pflbench.run.resources import missing_spec_message

        raise SpecError(str(path), [("file", missing_spec_message(path))])
    try:
        data = read_yaml(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(str(path), [("file", "not a text file (UTF-8 YAML expected): is this the spec?")]) from None
    except yaml.YAMLError as error:
        raise SpecError(str(path), [("file", f"not valid YAML: {str(error)[:1000]}")]) from None
    _check_size(data, str(path), "file")
    return parse_spec(data, source=str(path), sets=sets, default_name=path.stem, scale=scale, base_dir=path.parent)


def parse_spec(
    data: Any,
    source: str = "<spec>",
    sets: dict[str, Any] | None = None,
    default_name: str = "spec",
    scale: str | None = None,
    base_dir: str | Path | None = None,
) -> Plan:
    """Validate and expand a spec given as data; `base_dir` is where `tuned:` looks for its folder
    (the spec file's folder; default: the current directory)."""
    problems = Problems()
    if not isinstance(data, dict):
        raise SpecError(source, [("file", f"must be a mapping with keys {', '.join(SPEC_KEYS)}, got {echo(data)}")])
    data = dict(data)
    _load_plugins(data.get("plugins"), source, base_dir)  # the user's own names, before any is checked
    data["matrix"] = dict(data.get("matrix") or {})
    data["resources"] = dict(data.get("resources") or {})
    scale = scale or FULL_SCALE
    chosen, origins = _apply_scale(data, scale, source)
    command_line = _split_sets(sets or {}, data, origins)
    try:
        spec = SpecFile.model_validate(data)
    except ValidationError as error:
        problems.add_validation("", error)
        raise SpecError(source, [(where.lstrip(".") or "file", msg) for where, msg in problems.items]) from None

    resources = problems.check(TypeAdapter(Resources), spec.resources, origins.get("resources", "resources"))
    axes, optional = _parse_axes(spec.matrix, origins, problems)
    defaults = _assignments_of(spec.defaults, "defaults", problems)
    override_blocks = [("overrides", spec.overrides)]
    if chosen is not None:
        where = f"scales.{scale}"
        defaults.update(_assignments_of(chosen.defaults, f"{where}.defaults", problems))
        override_blocks.append((f"{where}.overrides", chosen.overrides))
    rules = [
        Rule(
            _condition_of(o.when, f"{block}[{i}].when", problems),
            _assignments_of(o.assign, f"{block}[{i}].set", problems),
            _condition_of(o.unless, f"{block}[{i}].unless", problems) if o.unless else None,
        )
        for block, overrides in override_blocks
        for i, o in enumerate(overrides)
    ]
    if problems:
        raise SpecError(source, list(problems.items))
    tuned: dict[str, str] = {}
    if spec.tuned is not None:
        tuned_rules, tuned = _tuned_rules(spec.tuned, _spec_algorithms(axes, defaults, rules), base_dir, problems)
        rules += tuned_rules
    rules.append(Rule(Condition({}), _assignments_of(command_line, "--set", problems)))
    if problems:
        raise SpecError(source, list(problems.items))

    _check_required(axes, defaults, rules, problems)
    _check_hyperparameter_names(axes, defaults, rules, problems)
    if problems:
        raise SpecError(source, list(problems.items))
    cells = _expand(axes, defaults, rules, problems, base_dir)
    if problems:
        raise SpecError(source, list(problems.items))
    return Plan(
        spec.name or default_name,
        source,
        spec.description,
        cells,
        resources,
        frozenset(optional),
        scale=scale,
        scales=(FULL_SCALE, *spec.scales),
        tuned=tuned,
        variants=tuple(_variant_names(data["matrix"].get(VARIANTS_AXIS))),
        trackers=tuple(spec.trackers),
    )


def resolve_cell(values: dict[str, Any], source: str = "<cell>") -> CellConfig:
    """One fully resolved cell from cell fields (`{"algorithm": ..., "dataset": ..., "hp": {...}}` or
    `hp.NAME` keys), through the same checks and default resolution as a spec's cells, so the same
    settings give the same hash. Raises SpecError (e.g. a hyperparameter the algorithm does not have)."""
    problems = Problems()
    flat = _assignments_of(values, "cell", problems)
    for key in ("algorithm", "dataset"):
        if key not in flat and not problems:
            problems.add(f"cell.{key}", "missing")
    if not problems:
        declared = hyperparameters(flat["algorithm"].value)
        for key, assigned in flat.items():
            if key.startswith("hp.") and key.removeprefix("hp.") not in declared:
                problems.add(
                    assigned.origin,
                    unknown_message(f"hyperparameter of {flat['algorithm'].value}", key.removeprefix("hp."), declared),
                )
    cell = None if problems else _build_cell(flat, problems)
    if problems or cell is None:
        raise SpecError(source, list(problems.items))
    return cell


def _load_plugins(entries: Any, source: str, base_dir: str | Path | None) -> None:
    """The spec's `plugins:` (paths relative to the spec's folder, or module names), loaded now."""
    from pflbench.loader.plugins import PluginError, load_one, load_builtins

    if entries is None:
        return
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise SpecError(source, [("plugins", f"must be a list of .py paths or module names, got {echo(entries)}")])
    load_builtins()
    for i, entry in enumerate(entries):
        try:
            load_one(entry, base_dir)
        except PluginError as error:
            raise SpecError(source, [(f"plugins[{i}]", str(error))]) from None


def _apply_scale(data: dict, scale: str, source: str) -> tuple[Scale | None, dict[str, str]]:
    """Put the chosen scale's matrix axes and resources into `data`; returns the scale (None for
    "full") and, per replaced axis (and "resources"), where its value was written."""
    origins: dict[str, str] = {}
    try:
        scales: dict[str, Scale] = TypeAdapter(dict[str, Scale]).validate_python(data.get("scales") or {})
    except ValidationError as error:
        problems = Problems()
        problems.add_validation("scales", error)
        raise SpecError(source, list(problems.items)) from None
    if FULL_SCALE in scales:
        raise SpecError(
            source,
            [
                (
                    f"scales.{FULL_SCALE}",
                    f"{FULL_SCALE!r} is the spec as written; give the full settings in matrix/defaults/overrides",
                )
            ],
        )
    if scale == FULL_SCALE:
        return None, origins
    if scale not in scales:
        raise SpecError(source, [("--scale", unknown_message("scale", scale, [FULL_SCALE, *scales]))])
    chosen = scales[scale]
    for key, value in chosen.matrix.items():
        data["matrix"][key] = value
        origins[key] = f"scales.{scale}.matrix.{key}"
    if chosen.resources:
        data["resources"] = {**data["resources"], **chosen.resources}
        origins["resources"] = f"scales.{scale}.resources"
    return chosen, origins


def _spec_algorithms(axes: Axes, defaults: Assignments, rules: list[Rule]) -> list[str]:
    return sorted(
        {
            a.value
            for assignments, _ in _all_assignments(axes, defaults, rules)
            for k, a in assignments.items()
            if k == "algorithm" and a.value
        }
    )


def tuned_path(directory: str | Path, algorithm: str) -> Path:
    return Path(directory) / f"{algorithm}.yaml"


def _tuned_rules(
    setting: TunedSetting, algorithms: list[str], base_dir: str | Path | None, problems: Problems
) -> tuple[list[Rule], dict[str, str]]:
    """One rule per algorithm with a tuned configuration: `when: {algorithm: NAME}`, set the tuned
    values and `hp_source: tuned`."""
    directory = Path(setting.dir) if setting.dir else Path(TUNED_DIR)
    if not directory.is_absolute():
        directory = Path(base_dir or ".") / directory
    rules: list[Rule] = []
    used: dict[str, str] = {}
    wanted = algorithms if setting.algorithms is None else setting.algorithms
    for i, name in enumerate(wanted):
        where = "tuned" if setting.algorithms is None else f"tuned.algorithms[{i}]"
        if name not in algorithms:
            problems.add(where, unknown_message("algorithm of this spec", name, algorithms))
            continue
        path = tuned_path(directory, name)
        if not path.is_file():
            if setting.algorithms is not None:
                problems.add(
                    where,
                    f"no tuned configuration for {name!r}: {path} does not exist "
                    f"(write it with `pflbench sweep --algo {name} --out {directory}`)",
                )
            continue
        try:
            tuned = TunedFile.model_validate(yaml.safe_load(path.read_text()))
        except (yaml.YAMLError, ValidationError) as error:
            problems.add(str(path), f"not a tuned configuration: {error}")
            continue
        if tuned.algorithm != name:
            problems.add(f"{path}: algorithm", f"is {tuned.algorithm!r}, expected {name!r} (the file's name)")
            continue
        assignments = _assignments_of(tuned.assign, f"{path}: set", problems)
        assignments["hp_source"] = Assigned("tuned", f"{path}")
        rules.append(Rule(Condition({"algorithm": (name,)}), assignments))
        used[name] = str(path)
    return rules, used


def _variant_names(entries: Any) -> list[Any]:
    """The names of a `variants` axis's entries, in the spec's order."""
    return [e.get("name") for e in _listify(entries) if isinstance(e, dict)]


def _chosen_variants(entries: Any, names: Any) -> list[Any]:
    """The entries of a spec's `variants` axis named by `--set variant=NAME` (or a list of names), in
    the spec's order: the one way to narrow a variants axis to a cell from the command line."""
    wanted = [str(n) for n in _listify(names)]
    offered = _variant_names(entries)
    if not offered:
        raise SpecError("--set", [(VARIANT_SELECTOR, f"this spec has no matrix.{VARIANTS_AXIS} axis to choose from")])
    unknown = [n for n in wanted if n not in offered]
    if unknown or not wanted:
        raise SpecError(
            "--set", [(VARIANT_SELECTOR, unknown_message("variant", unknown[0] if unknown else "", offered))]
        )
    return [e for e in _listify(entries) if isinstance(e, dict) and e.get("name") in wanted]


def _client_count(entry: Any) -> Any:
    """The client count an entry of a `clients` axis (`10` or `{clients: 100, participation: 0.1}`) sets."""
    return entry.get(CLIENTS_AXIS) if isinstance(entry, dict) else entry


def _chosen_client_settings(entries: Any, value: Any) -> list[Any]:
    """`--set clients=N` (or a list of counts): per count, the spec's own entries of the `clients`
    axis with that count, whole (a paper's "100 clients" is its setting with 10% joining, not 100
    clients training every round); a count the spec does not have is a new entry, as written (the
    usual way to shrink a spec: `--set clients=4`). A mapping is always an entry as written
    (`--set 'clients={clients: 100, participation: 1.0}'`)."""
    offered = _listify(entries) if entries is not None else []
    chosen: list[Any] = []
    for wanted in _listify(value):
        is_count = isinstance(wanted, int) and not isinstance(wanted, bool)
        matching = [e for e in offered if _client_count(e) == wanted] if is_count else []
        chosen.extend(matching or [wanted])
    return chosen


def _split_sets(sets: dict[str, Any], data: dict, origins: dict[str, str]) -> dict[str, Any]:
    """`--set` of a matrix axis, of a structured axis or with a list value replaces (or adds) that
    axis; `resources.*` sets a resource; anything else becomes a final, unconditional override
    (returned). Replaced axes are noted in `origins`. `variant=NAME` keeps the named entries of the
    `variants` axis; `clients=N` keeps the spec's entries for N clients, participation included
    (`_chosen_client_settings`). `KEY+=VALUES` adds values to the matrix axis
    KEY (`--set 'algorithm+=[mine]'`: a plugin's method beside a spec's rows; `all` stays all)."""
    command_line = {}
    for key, value in sets.items():
        if key.endswith("+"):
            axis = key[:-1].strip()
            if axis not in data["matrix"]:
                raise SpecError(
                    "--set", [(f"{axis}+=", unknown_message("matrix axis of this spec", axis, list(data["matrix"])))]
                )
            if data["matrix"][axis] != "all":
                data["matrix"][axis] = [*_listify(data["matrix"][axis]), *_listify(value)]
            origins[axis] = f"--set {axis}+="
        elif key.startswith("resources."):
            data["resources"][key.removeprefix("resources.")] = value
            origins["resources"] = "--set resources"
        elif key == VARIANT_SELECTOR:
            data["matrix"][VARIANTS_AXIS] = _chosen_variants(data["matrix"].get(VARIANTS_AXIS), value)
            origins[VARIANTS_AXIS] = f"--set {VARIANT_SELECTOR}"
        elif key == CLIENTS_AXIS:
            data["matrix"][key] = _chosen_client_settings(data["matrix"].get(key), value)
            origins[key] = f"--set {key}"
        elif key in STRUCTURED_AXES or key in data["matrix"] or isinstance(value, list):
            data["matrix"][key] = value
            origins[key] = f"--set {key}"
        else:
            command_line[key] = value
    return command_line


def _variant_entries(raw: Any, where: str, problems: Problems) -> list[Assignments] | None:
    """The `variants` axis: named bundles of settings, each entry's settings checked like an override's."""
    entries = problems.check(VARIANTS_TYPE, raw, where)
    if entries is None:
        return None
    names = [entry.name for entry in entries]
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.add(f"{where}[{i}].name", f"{echo(name)} names two variants; give each its own name")
    return [_assignments_of(entry.assign, f"{where}[{i}].set", problems) for i, entry in enumerate(entries)]


def _parse_axes(matrix: dict[str, Any], origins: dict[str, str], problems: Problems) -> tuple[Axes, set[str]]:
    """Matrix axes, in file order, each a list of flat assignments; and the optional datasets."""
    axes: Axes = []
    optional: set[str] = set()
    assigned_by: dict[str, str] = {}
    for key, raw in matrix.items():
        where = origins.get(key, f"matrix.{key}")
        if key == VARIANTS_AXIS:
            entries_where = _variant_entries(raw, where, problems)
            if entries_where is None:
                continue
            for k in {k for entry in entries_where for k in entry}:
                if k in assigned_by and assigned_by[k] != where:
                    problems.add(where, f"{echo(k)} is already varied by {assigned_by[k]}; vary it in one axis only")
                assigned_by[k] = where
            axes.append((key, entries_where))
            continue
        if key in STRUCTURED_AXES:
            entries = problems.check(AXIS_TYPES[key], raw, where)
            if entries is None:
                continue
            values = [{"algorithm": e} if key == "algorithm" else e.assignments() for e in entries]
            optional |= {e.name for e in entries if key == "dataset" and e.optional}
        else:
            reason = (
                _settable(key)
                if key not in DICT_FIELDS
                else (f"vary single entries, e.g. {key}.NAME: [VALUE, ...], or use a structured axis")
            )
            if reason:
                problems.add(where, reason)
                continue
            raw_values = _listify(raw)
            if not raw_values:
                problems.add(where, "empty list; give at least one value")
                continue
            values = []
            for i, value in enumerate(raw_values):
                checked = problems.check(_field_type(key), value, f"{where}[{i}]")
                values.append({key: checked})
        entries_where = [{k: Assigned(v, f"{where}[{i}]") for k, v in entry.items()} for i, entry in enumerate(values)]
        for k in {k for entry in values for k in entry}:
            if k in assigned_by and assigned_by[k] != where:
                problems.add(where, f"{echo(k)} is already varied by {assigned_by[k]}; vary it in one axis only")
            assigned_by[k] = where
        axes.append((key, entries_where))
    return axes, optional


def _all_assignments(
    axes: Axes, defaults: Assignments, rules: list[Rule]
) -> Iterator[tuple[Assignments, tuple[Any, ...] | None]]:
    """Every (assignments, algorithms the assignments are restricted to or None) of the spec."""
    yield defaults, None
    for _, entries in axes:
        for entry in entries:
            yield entry, None
    for rule in rules:
        yield rule.assignments, rule.condition.values.get("algorithm")


def _check_required(axes: Axes, defaults: Assignments, rules: list[Rule], problems: Problems) -> None:
    given = set(defaults) | {k for _, entries in axes for entry in entries for k in entry}
    for key in ("algorithm", "dataset"):
        if key not in given:
            problems.add(f"matrix.{key}", f"missing: every cell needs a {key} (give matrix.{key} or defaults.{key})")


def _check_hyperparameter_names(axes: Axes, defaults: Assignments, rules: list[Rule], problems: Problems) -> None:
    """An `hp.NAME` applies to the cells whose algorithm declares NAME, so it must be declared by one
    of the spec's algorithms (by the `when`'s algorithms, in an override that names them)."""
    spec_algorithms = _spec_algorithms(axes, defaults, rules)
    for assignments, restricted in _all_assignments(axes, defaults, rules):
        candidates = sorted(set(restricted)) if restricted else spec_algorithms
        declared = {name: hyperparameters(name) for name in candidates}
        for key, assigned in assignments.items():
            if not key.startswith("hp."):
                continue
            name = key.removeprefix("hp.")
            if not any(name in fields for fields in declared.values()):
                every = sorted({f for fields in declared.values() for f in fields})
                listing = "; ".join(f"{a}: {', '.join(f) or 'none'}" for a, f in declared.items())
                close = difflib.get_close_matches(name, every, n=1) if len(name) <= 200 else []
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.add(
                    assigned.origin,
                    f"no algorithm of this spec ({', '.join(candidates)}) has the "
                    f"hyperparameter {echo(name)}{hint}; declared: {listing}",
                )


def _expand(
    axes: Axes, defaults: Assignments, rules: list[Rule], problems: Problems, base_dir: str | Path | None = None
) -> list[CellConfig]:
    """The cross product of the axes in file order, resolved and checked; identical cells once."""
    cells: dict[str, CellConfig] = {}
    for combination in itertools.product(*(entries for _, entries in axes)):
        flat = dict(defaults)
        for entry in combination:
            flat.update(entry)
        for rule in rules:
            if rule.applies(flat):
                flat.update(rule.assignments)
        cell = _build_cell(flat, problems, base_dir)
        if cell is not None:
            cells.setdefault(cell.canonical_json(), cell)
    return list(cells.values())


def _build_cell(flat: Assignments, problems: Problems, base_dir: str | Path | None = None) -> CellConfig | None:
    """One resolved cell (`pflbench.simulator.resolve`); problems are reported at the place each offending value
    was written."""
    from pflbench.simulator.resolve import CellError, resolve

    declared = set(hyperparameters(flat["algorithm"].value))
    fields: dict[str, Any] = {group: {} for group in DICT_FIELDS}
    for key, assigned in flat.items():
        group, dot, entry = key.partition(".")
        if not dot:
            fields[key] = assigned.value
        elif group != "hp" or entry in declared:  # an hp value applies where the algorithm has it
            fields[group][entry] = assigned.value
    try:
        return resolve(fields, base_dir)
    except CellError as error:
        for names, message in error.problems:
            found = [a.origin for k, a in flat.items() if k.split(".")[0] in names]
            problems.add(", ".join(dict.fromkeys(found)) or "defaults", message)
        return None


def describe_partition(cell: CellConfig) -> str:
    """`dirichlet(alpha=0.3)`: a scheme with its parameters, for tables."""
    params = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(cell.partition_params.items()))
    return f"{cell.partition}({params})" if params else cell.partition
