"""A cell checked once: `resolve(values) -> CellConfig`.

Every check a cell must pass before any work starts, and the resolution of every default into it, live
here: the spec (`pflbench.run.spec`, which maps a problem to the place each value was written) and
`run_cell` (for a cell built by hand) both call `resolve`. So a cell's identity (`cell_hash`) and its
stored configuration say exactly what ran: the algorithm's hyperparameters (registry names among them,
e.g. MH-pFedHNGD's `global_model`, checked against the model registry), the scheme's parameters, the
dataset's options, and only the non-default entries of the heterogeneity knobs.

Resolution depends on the cell's content alone, so a resolved cell resolves to itself; `run_cell`
trusts a cell whose content this process has resolved (`ensure_resolved`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pflbench.config import CellConfig
from pflbench.registry import echo


class CellError(ValueError):
    """A cell that cannot run. `problems`: (the cell fields at fault, message) pairs; `error`: the
    first underlying exception (its own type, for callers that catch e.g. a ShiftError)."""

    def __init__(self, problems: list[tuple[tuple[str, ...], str]], error: Exception) -> None:
        self.problems = problems
        self.error = error
        super().__init__("; ".join(message for _, message in problems))


def _failing(fields: tuple[str, ...], error: Exception) -> CellError:
    return CellError([(fields, str(error))], error)


def resolve(values: dict[str, Any] | CellConfig, base_dir: str | Path | None = None) -> CellConfig:
    """The fully resolved cell of `values` (CellConfig's fields; dict fields as dicts), or CellError.
    `base_dir`: where a relative path in the partition parameters (an imported file) is read from."""
    from pflbench.simulator import shifts
    from pflbench.algorithm import get_algorithm
    from pflbench.capabilities import Refusal
    from pflbench.data.sources import make_source
    from pflbench.newcomers.check import check_unseen
    from pflbench.data.partitioning import make_partitioner
    from pflbench.loader.plugins import plugin_hashes
    from pflbench.simulator.privacy import parse_privacy
    from pflbench.simulator.system import parse_system

    if isinstance(values, CellConfig):
        values = values.model_dump()
    try:
        cell = CellConfig(**values)
    except ValidationError as error:
        raise CellError(
            [((str(e["loc"][0]),), f"{e['msg']} (got {echo(e['input'])})") for e in error.errors(include_url=False)],
            error,
        ) from None
    try:
        algorithm = get_algorithm(cell.algorithm)
    except ValueError as error:  # an unknown name: the message lists the registered ones
        raise _failing(("algorithm",), error) from None
    try:  # the algorithm's hyperparameters, with its defaults filled in
        hp = algorithm.parse_hyperparams(cell.hp)
    except ValueError as error:
        raise _failing(("algorithm", "hp"), error) from None
    try:  # an imported file's path (relative: to base_dir, the spec's folder) and sha256 enter the cell
        scheme = make_partitioner(cell.partition, cell.partition_params).resolved(base_dir)
    except ValueError as error:
        raise _failing(("partition", "partition_params"), error) from None
    try:
        source = make_source(cell.dataset, cell.dataset_options)
    except ValueError as error:
        raise _failing(("dataset", "dataset_options"), error) from None
    options = {k: v for k, v in source.options.items() if source.OPTIONS[k].changes_data}  # not e.g. `download`
    try:  # feature and concept shift: validated, and only their non-default entries kept (pflbench.simulator.shifts)
        shifted = shifts.resolve(cell.feature_shift, cell.concept_shift, cell.clients)
    except ValueError as error:
        raise _failing(("feature_shift", "concept_shift"), error) from None
    # System and privacy heterogeneity (pflbench/simulator/system.py, pflbench/simulator/privacy.py): validated, only the
    # entries that differ from the defaults kept, and refused by algorithms that cannot honour them.
    for knob, parse in (("system", lambda v: parse_system(v, cell.clients)), ("privacy", parse_privacy)):  # noqa: B023 (called in this iteration)
        try:
            cell = cell.model_copy(update={knob: parse(getattr(cell, knob))})
        except ValueError as error:
            raise _failing((knob,), error) from None
    try:  # unseen clients: at least one held out and one trained
        check_unseen(cell)
    except ValueError as error:
        raise _failing(("unseen_fraction", "clients", "algorithm"), error) from None
    try:  # what the algorithm can run: heterogeneous models, the knobs, newcomers (pflbench.capabilities)
        algorithm.check_cell(cell)
    except Refusal as refusal:
        raise _failing(refusal.fields, refusal) from None
    resolved = cell.model_copy(
        update={
            "hp": hp.model_dump(mode="json"),
            "dataset_options": options,
            "partition_params": scheme.params.model_dump(mode="json"),
            **shifted,
            # the source hashes of the user's plugins the cell uses: in its id
            "plugin_hashes": plugin_hashes(cell),
        }
    )
    _RESOLVED.add(resolved.canonical_json())
    return resolved


_RESOLVED: set[str] = set()  # canonical JSON of the cells resolved in this process


def ensure_resolved(cell: CellConfig) -> CellConfig:
    """`cell` itself where this process resolved a cell of the same content, else `resolve(cell)`;
    a problem is raised as its own exception (e.g. a ShiftError), naming what is wrong."""
    if cell.canonical_json() in _RESOLVED:
        return cell
    try:
        return resolve(cell)
    except CellError as problem:
        raise problem.error from None
