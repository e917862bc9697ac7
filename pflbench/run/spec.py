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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from pflbench.config import CellConfig
from pflbench.registry import echo, unknown_message  # noqa: F401  (unknown_message: used by others via spec)
from pflbench.run.spec_axes import (
    DICT_FIELDS,
    Assigned,
    Assignments,
    Axes,
    assignments_of,
    field_type,
    parse_axes,
    unsettable_reason,
    split_sets,
    variant_names,
)
from pflbench.run.spec_problems import Problems, SpecError, check_size
from pflbench.run.spec_schema import (
    VARIANTS_AXIS,
    Resources,
    Scale,
    SpecFile,
    TunedFile,
    TunedSetting,
    listify,
    hyperparameters,
)

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


FULL_SCALE = "full"  # the spec as written; every other scale is a block under `scales:`


TUNED_DIR = "tuned"  # default folder of tuned configurations, next to the spec file (benchmarks/tuned)


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
        reason = unsettable_reason(key)
        if reason:
            problems.add(f"{where}.{key}", reason)
            continue
        options = listify(wanted)
        checked = [
            problems.check(field_type(key), v, f"{where}.{key}" + (f"[{i}]" if len(options) > 1 else ""))
            for i, v in enumerate(options)
        ]
        values[key] = tuple(checked)
    return Condition(values)


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
    check_size(data, str(path), "file")
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
    command_line = split_sets(sets or {}, data, origins)
    try:
        spec = SpecFile.model_validate(data)
    except ValidationError as error:
        problems.add_validation("", error)
        raise SpecError(source, [(where.lstrip(".") or "file", msg) for where, msg in problems.items]) from None

    resources = problems.check(TypeAdapter(Resources), spec.resources, origins.get("resources", "resources"))
    axes, optional = parse_axes(spec.matrix, origins, problems)
    defaults = assignments_of(spec.defaults, "defaults", problems)
    override_blocks = [("overrides", spec.overrides)]
    if chosen is not None:
        where = f"scales.{scale}"
        defaults.update(assignments_of(chosen.defaults, f"{where}.defaults", problems))
        override_blocks.append((f"{where}.overrides", chosen.overrides))
    rules = [
        Rule(
            _condition_of(o.when, f"{block}[{i}].when", problems),
            assignments_of(o.assign, f"{block}[{i}].set", problems),
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
    rules.append(Rule(Condition({}), assignments_of(command_line, "--set", problems)))
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
        variants=tuple(variant_names(data["matrix"].get(VARIANTS_AXIS))),
        trackers=tuple(spec.trackers),
    )


def resolve_cell(values: dict[str, Any], source: str = "<cell>") -> CellConfig:
    """One fully resolved cell from cell fields (`{"algorithm": ..., "dataset": ..., "hp": {...}}` or
    `hp.NAME` keys), through the same checks and default resolution as a spec's cells, so the same
    settings give the same hash. Raises SpecError (e.g. a hyperparameter the algorithm does not have)."""
    problems = Problems()
    flat = assignments_of(values, "cell", problems)
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
    from pflbench.loader.plugins import PluginError, load_builtins, load_one

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
        assignments = assignments_of(tuned.assign, f"{path}: set", problems)
        assignments["hp_source"] = Assigned("tuned", f"{path}")
        rules.append(Rule(Condition({"algorithm": (name,)}), assignments))
        used[name] = str(path)
    return rules, used


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
