# pflbench: every target installs what it needs first (a virtual environment in .venv).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RESULTS ?= results
REPORTS ?= reports
# The offline dataset mirror of this workplace, used when present (see README: Datasets).
MIRROR := $(abspath $(wildcard ../shared/data))
ifneq ($(MIRROR),)
export PFLBENCH_DATA_MIRROR ?= $(MIRROR)
endif

.PHONY: install test demo bench report clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e ".[test]"
	touch $@

test: install
	$(BIN)/python -m pytest -q

# The report is written even when a cell failed or diverged; the run's exit status is kept.
demo: install
	$(BIN)/pflbench run benchmarks/demo.yaml; status=$$?; $(BIN)/pflbench report && exit $$status

bench: install
	mkdir -p reports
	$(BIN)/pflbench bench --json reports/bench.json

# Tables (report.md, report.tex), figures and the HTML leaderboard ($(REPORTS)/index.html) of a store.
report: install
	$(BIN)/pflbench report --results $(RESULTS) --out $(REPORTS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
