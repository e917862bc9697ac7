"""A spec's assignments and axes: a key assigned a value (checked against the cell's field types), the matrix's axes in file order, and which entries of the variants and clients axes a `--set` picks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BeforeValidator, TypeAdapter

from pflbench.config import CellConfig, reject_boolean
from pflbench.registry import echo, unknown_message  # noqa: F401  (unknown_message: used by others via spec)
from pflbench.run.spec_problems import Problems, SpecError, check_size
from pflbench.run.spec_schema import (
    AXIS_TYPES,
    NAME_CHECKS,
    VARIANTS_AXIS,
    VARIANTS_TYPE,
    listify,
)

# Dict-valued cell fields: their entries are addressed as `field.entry`.
DICT_FIELDS = ("dataset_options", "partition_params", "hp", "feature_shift", "concept_shift", "system", "privacy")


# Matrix axes with their own entry syntax; every other settable key can be an axis of plain values.
STRUCTURED_AXES = ("algorithm", "dataset", "partition", "clients")


VARIANT_SELECTOR = "variant"  # `--set variant=NAME`: one entry of the variants axis, by its name


CLIENTS_AXIS = "clients"  # `--set clients=N` picks the axis's entries for N clients (participation and all)


@cache
def field_type(key: str) -> TypeAdapter:
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


def unsettable_reason(key: str) -> str | None:
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


def assignments_of(mapping: dict[str, Any], where: str, problems: Problems) -> Assignments:
    """`{lr: 0.1, hp: {mu: 1}, partition_params.alpha: 0.3}` -> checked flat assignments."""
    flat: Assignments = {}
    for key, value in mapping.items():
        key = str(key)
        if key in DICT_FIELDS:
            if not isinstance(value, dict):
                problems.add(f"{where}.{key}", f"must be a mapping of entries, got {echo(value)}")
                continue
            flat.update(assignments_of({f"{key}.{k}": v for k, v in value.items()}, where, problems))
            continue
        origin = f"--set {key}" if where == "--set" else f"{where}.{key}"
        reason = unsettable_reason(key)
        if reason:
            problems.add(origin, reason)
            continue
        checked = problems.check(field_type(key), value, origin)
        if checked is not None or value is None:
            flat[key] = Assigned(checked, origin)
    return flat


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
        check_size(sets[key.strip()], "--set", echo(key.strip()))
    return sets


def variant_names(entries: Any) -> list[Any]:
    """The names of a `variants` axis's entries, in the spec's order."""
    return [e.get("name") for e in listify(entries) if isinstance(e, dict)]


def _chosen_variants(entries: Any, names: Any) -> list[Any]:
    """The entries of a spec's `variants` axis named by `--set variant=NAME` (or a list of names), in
    the spec's order: the one way to narrow a variants axis to a cell from the command line."""
    wanted = [str(n) for n in listify(names)]
    offered = variant_names(entries)
    if not offered:
        raise SpecError("--set", [(VARIANT_SELECTOR, f"this spec has no matrix.{VARIANTS_AXIS} axis to choose from")])
    unknown = [n for n in wanted if n not in offered]
    if unknown or not wanted:
        raise SpecError(
            "--set", [(VARIANT_SELECTOR, unknown_message("variant", unknown[0] if unknown else "", offered))]
        )
    return [e for e in listify(entries) if isinstance(e, dict) and e.get("name") in wanted]


def _client_count(entry: Any) -> Any:
    """The client count an entry of a `clients` axis (`10` or `{clients: 100, participation: 0.1}`) sets."""
    return entry.get(CLIENTS_AXIS) if isinstance(entry, dict) else entry


def _chosen_client_settings(entries: Any, value: Any) -> list[Any]:
    """`--set clients=N` (or a list of counts): per count, the spec's own entries of the `clients`
    axis with that count, whole (a paper's "100 clients" is its setting with 10% joining, not 100
    clients training every round); a count the spec does not have is a new entry, as written (the
    usual way to shrink a spec: `--set clients=4`). A mapping is always an entry as written
    (`--set 'clients={clients: 100, participation: 1.0}'`)."""
    offered = listify(entries) if entries is not None else []
    chosen: list[Any] = []
    for wanted in listify(value):
        is_count = isinstance(wanted, int) and not isinstance(wanted, bool)
        matching = [e for e in offered if _client_count(e) == wanted] if is_count else []
        chosen.extend(matching or [wanted])
    return chosen


def split_sets(sets: dict[str, Any], data: dict, origins: dict[str, str]) -> dict[str, Any]:
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
                data["matrix"][axis] = [*listify(data["matrix"][axis]), *listify(value)]
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
    return [assignments_of(entry.assign, f"{where}[{i}].set", problems) for i, entry in enumerate(entries)]


def parse_axes(matrix: dict[str, Any], origins: dict[str, str], problems: Problems) -> tuple[Axes, set[str]]:
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
            _claim_keys(entries_where, where, assigned_by, problems)
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
                unsettable_reason(key)
                if key not in DICT_FIELDS
                else (f"vary single entries, e.g. {key}.NAME: [VALUE, ...], or use a structured axis")
            )
            if reason:
                problems.add(where, reason)
                continue
            raw_values = listify(raw)
            if not raw_values:
                problems.add(where, "empty list; give at least one value")
                continue
            values = []
            for i, value in enumerate(raw_values):
                checked = problems.check(field_type(key), value, f"{where}[{i}]")
                values.append({key: checked})
        entries_where = [{k: Assigned(v, f"{where}[{i}]") for k, v in entry.items()} for i, entry in enumerate(values)]
        _claim_keys(entries_where, where, assigned_by, problems)
        axes.append((key, entries_where))
    return axes, optional


def _claim_keys(entries: list[Assignments], where: str, assigned_by: dict[str, str], problems: Problems) -> None:
    """Note in `assigned_by` that the axis at `where` varies its entries' keys; a problem for each key
    another axis already varies."""
    for k in {k for entry in entries for k in entry}:
        if k in assigned_by and assigned_by[k] != where:
            problems.add(where, f"{echo(k)} is already varied by {assigned_by[k]}; vary it in one axis only")
        assigned_by[k] = where
