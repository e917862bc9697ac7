"""The structure of a spec file (benchmarks/README.md): its parts as strict pydantic models (an unknown
key is an error with a "did you mean"), the structured matrix axes and the names they check against
the registries. How a spec becomes cells is `pflbench.run.spec`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Self
from collections.abc import Callable

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator

from pflbench.registry import unknown_message

if TYPE_CHECKING:
    from pflbench.algorithm import AlgorithmRegistry


# ---- registries (imported lazily: they pull in torch) -------------------------------------------


def _algorithms() -> AlgorithmRegistry:
    from pflbench.algorithm import ALGORITHMS

    return ALGORITHMS


def _check_algorithm(name: str) -> str:
    _algorithms().get(name)
    return name


def _check_dataset(name: str) -> str:
    from pflbench.data import DATASETS

    DATASETS.get(name)
    return name


def _check_scheme(name: str) -> str:
    from pflbench.data.partitioning import PARTITIONS

    PARTITIONS.get(name)
    return name


def _check_model(name: str) -> str:
    """A model name, `auto`, or a heterogeneous group spec (`hetero5`, `mh-cnn,vgg8`)."""
    from pflbench.simulator.models import check_model_spec

    return check_model_spec(name)


NAME_CHECKS: dict[str, Callable[[str], str]] = {
    "algorithm": _check_algorithm,
    "dataset": _check_dataset,
    "partition": _check_scheme,
    "model": _check_model,
}


def hyperparameters(algorithm: str) -> list[str]:
    return list(_algorithms().get(algorithm).Hyperparams.model_fields)


# ---- the file's structure ------------------------------------------------------------------------


class SpecModel(BaseModel):
    """Strict parts of a spec: unknown keys are errors with a "did you mean"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = [f.alias or name for name, f in cls.model_fields.items()]
            for key in data:
                if key not in allowed:
                    raise ValueError(unknown_message("key", key, allowed))
        return data


def listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class Resources(SpecModel):
    """What one cell asks of a Ray node; torch in the cell uses `cpus` threads."""

    cpus: float = Field(1.0, gt=0)
    gpus: float = Field(0.0, ge=0)


class NamedEntry(SpecModel):
    """An axis entry written as a mapping or as its bare name: the value of its `NAME_KEY` key."""

    NAME_KEY: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {cls.NAME_KEY: data} if isinstance(data, str) else data


class DatasetEntry(NamedEntry):
    NAME_KEY = "name"

    name: Annotated[str, AfterValidator(_check_dataset)]
    options: dict[str, Any] = Field(default_factory=dict)
    optional: bool = False  # skip this dataset's cells, with a note, where it cannot be loaded

    @model_validator(mode="after")
    def _options(self) -> Self:
        from pflbench.data.sources import make_source

        make_source(self.name, self.options)  # ValueError naming the option and the allowed ones
        return self

    def assignments(self) -> dict[str, Any]:
        return {"dataset": self.name, **{f"dataset_options.{k}": v for k, v in self.options.items()}}


class PartitionEntry(NamedEntry):
    NAME_KEY = "scheme"

    scheme: Annotated[str, AfterValidator(_check_scheme)]
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _params(self) -> Self:
        from pflbench.data.partitioning import make_partitioner

        make_partitioner(self.scheme, self.params)  # PartitionError naming the parameter
        return self

    def assignments(self) -> dict[str, Any]:
        return {"partition": self.scheme, **{f"partition_params.{k}": v for k, v in self.params.items()}}


class ClientSetting(SpecModel):
    """A client count with how many of them join each round. `--set clients=N` keeps the spec's own
    entries for N clients, participation included (a count the spec has no entry for is a new entry
    with every client joining; a mapping is taken as written)."""

    clients: int = Field(ge=1)
    participation: float | None = Field(None, gt=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _from_number(cls, data: Any) -> Any:
        return {"clients": data} if isinstance(data, int) and not isinstance(data, bool) else data

    def assignments(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def _algorithm_axis(value: Any) -> list[Any]:
    """`all` means every registered algorithm, so a spec picks up new ones without edits."""
    return _algorithms().names() if value == "all" else listify(value)


AXIS_TYPES: dict[str, TypeAdapter] = {
    "algorithm": TypeAdapter(
        Annotated[
            list[Annotated[str, AfterValidator(_check_algorithm)]],
            BeforeValidator(_algorithm_axis),
            Field(min_length=1),
        ]
    ),
    "dataset": TypeAdapter(Annotated[list[DatasetEntry], BeforeValidator(listify), Field(min_length=1)]),
    "partition": TypeAdapter(Annotated[list[PartitionEntry], BeforeValidator(listify), Field(min_length=1)]),
    "clients": TypeAdapter(Annotated[list[ClientSetting], BeforeValidator(listify), Field(min_length=1)]),
}


class Override(SpecModel):
    when: dict[str, Any] = Field(default_factory=dict)
    unless: dict[str, Any] = Field(default_factory=dict)  # the cells `when` matches, but not these
    assign: dict[str, Any] = Field(alias="set")


class Variant(SpecModel):
    """One entry of the `variants` axis: settings that go together, under a name for the reader. The
    name is not part of any cell: a variant's cells are identified by their settings alone, so a
    variant that sets nothing gives the same cells (same ids) as a spec without the axis."""

    name: str = Field(min_length=1)
    assign: dict[str, Any] = Field(default_factory=dict, alias="set")


VARIANTS_AXIS = "variants"
VARIANTS_TYPE: TypeAdapter[list[Variant]] = TypeAdapter(
    Annotated[list[Variant], BeforeValidator(listify), Field(min_length=1)]
)


class Scale(SpecModel):
    """A named variant of the spec (`pflbench run SPEC --scale NAME`): its matrix axes replace the
    spec's, its defaults and overrides come after the spec's, its resources replace the spec's."""

    description: str = ""
    matrix: dict[str, Any] = Field(default_factory=dict)
    defaults: dict[str, Any] = Field(default_factory=dict)
    overrides: list[Override] = Field(default_factory=list)
    resources: dict[str, Any] = Field(default_factory=dict)


class TunedSetting(SpecModel):
    """`tuned: {dir: benchmarks/tuned, algorithms: all | [names]}`; `tuned: true` is `algorithms: all`
    (every algorithm of the spec that has a tuned file uses it), `tuned: [names]` requires those files."""

    dir: str | None = None  # default: `tuned/` next to the spec file
    algorithms: list[str] | None = None  # None: every algorithm of the spec that has a file

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, data: Any) -> Any:
        if data is True:
            return {}
        if isinstance(data, (list, str)):
            return {"algorithms": listify(data)}
        if isinstance(data, dict) and data.get("algorithms") == "all":
            return {**data, "algorithms": None}
        return data


class TunedFile(SpecModel):
    """benchmarks/tuned/<algo>.yaml, written by `pflbench sweep`: the values to set in that
    algorithm's cells, and (free-form) how they were found."""

    algorithm: str
    assign: dict[str, Any] = Field(alias="set")
    description: str = ""
    tuned_on: dict[str, Any] = Field(default_factory=dict)


def _tracker_kind(value: Any) -> str:
    from pflbench.run.trackers import KINDS

    if value not in KINDS:
        raise ValueError(unknown_message("tracker", value, list(KINDS)))
    return value


TrackerKind = Annotated[str, AfterValidator(_tracker_kind)]


class SpecFile(SpecModel):
    name: str | None = None
    description: str = ""
    plugins: list[str] = Field(default_factory=list)  # loaded before validation (pflbench/loader/plugins.py)
    matrix: dict[str, Any]
    defaults: dict[str, Any] = Field(default_factory=dict)
    overrides: list[Override] = Field(default_factory=list)
    resources: dict[str, Any] = Field(default_factory=dict)
    scales: dict[str, Scale] = Field(default_factory=dict)
    tuned: TunedSetting | None = None
    # stream every cell's rounds to these trackers (pflbench/run/trackers.py), besides any `--tracker`
    trackers: Annotated[list[TrackerKind], BeforeValidator(listify)] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _tuned_off(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("tuned") is False:
            return {**data, "tuned": None}
        return data
