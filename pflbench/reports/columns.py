"""A column of the reports' tables (pflbench.reports.tables): a dataset at a number of clients. Its own
module, so that what captions a table (pflbench.reports.budget) names it without the tables."""

from __future__ import annotations

from dataclasses import dataclass

from pflbench.reports.cells import DATASET_ALIASES


@dataclass(frozen=True)
class Column:
    """A table's column: a dataset at a number of clients, and the scheme's parameters where a table
    shows them apart (`show_params`)."""

    dataset: str
    clients: int
    params: str = ""
    show_params: bool = False

    @property
    def key(self) -> tuple:
        return (self.dataset, self.clients, self.params)

    @property
    def paper_dataset(self) -> str:
        return DATASET_ALIASES.get(self.dataset, (self.dataset, ""))[0]

    @property
    def data_note(self) -> str:
        return DATASET_ALIASES.get(self.dataset, ("", ""))[1]

    @property
    def label(self) -> str:
        text = f"{self.dataset}, {self.clients} clients"
        return text + (f" ({self.params})" if self.show_params and self.params else "")
