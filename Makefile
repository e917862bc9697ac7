# pflbench: every target installs what it needs first (a virtual environment in .venv).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RESULTS ?= results
REPORTS ?= reports
# The offline dataset mirror of this workplace, used when present (docs/howto/datasets.md).
MIRROR := $(abspath $(wildcard ../shared/data))
ifneq ($(MIRROR),)
export PFLBENCH_DATA_MIRROR ?= $(MIRROR)
endif

.PHONY: install test lint demo bench report leaderboard reproduce-table1 reproduce-table2 sweep clean gpu-kit gpu-rehearse gpu-aside gpu-back docs

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e ".[test,flwr]"
	# Flower Datasets declares rich<15 (we pin 15; its partitioners do not use rich): without its deps
	$(BIN)/pip install --disable-pip-version-check -q --no-deps flwr-datasets==0.6.1
	touch $@

# The suite in TEST_WORKERS processes (pytest-xdist): a test module runs whole in one of them, the tests
# that start Ray clusters of their own one after another, the longest modules handed out first
# (tests/conftest.py: SERIAL_GROUPS, LONG_UNITS). Three on two cores: many tests
# wait on processes they start (Ray, `pflbench` runs), and a third process uses the cores meanwhile.
# TEST_WORKERS=0: one process, as a plain `pytest`. The 25 slowest tests are listed at the end (with the load
# they ran under in mind: tests/budgets.py), so that a test growing slow shows where the suite's time goes.
TEST_WORKERS ?= 3
test: install
	$(BIN)/python -m pytest -q --durations=25 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)

# Lint: ruff's checks everywhere; ruff's formatting on the package and its tests; mypy on the whole package,
# pflbench/ (the built-in algorithms and partition schemes included; pyproject.toml's [tool.mypy]).
lint: install
	$(BIN)/pip install --disable-pip-version-check -q -e ".[lint]"
	$(BIN)/ruff check .
	$(BIN)/ruff format --check pflbench tests
	$(BIN)/mypy

# The report is written even when a cell failed or diverged; the run's exit status is kept.
demo: install
	$(BIN)/pflbench run benchmarks/demo.yaml; status=$$?; $(BIN)/pflbench report && exit $$status

# pFedLA's Tables 1-2 (benchmarks/table1.yaml, table2.yaml): full scale where torch sees CUDA (cells
# share the GPUs Ray sees, 1/8 GPU each), else the quick scale; SCALE=quick|full overrides. Results
# and report per table and scale: results/table1-quick/, reports/table1-quick/report.md. The report
# is written even when a cell failed; the run's exit status is kept.
SCALE ?=
reproduce-table1 reproduce-table2: reproduce-%: install
	@scale="$(SCALE)"; \
	if [ -z "$$scale" ]; then scale=$$($(BIN)/python -c "import torch; print('full' if torch.cuda.is_available() else 'quick')"); fi; \
	echo "$*: scale $$scale"; \
	$(BIN)/pflbench run benchmarks/$*.yaml --scale $$scale --results results/$*-$$scale; status=$$?; \
	$(BIN)/pflbench report --results results/$*-$$scale --out reports/$*-$$scale && exit $$status

# Tune one algorithm (Ray Tune + Optuna + ASHA on validation accuracy); the best configuration goes
# to benchmarks/tuned/$(ALGO).yaml. TRIALS (default 20) is the same for every algorithm; SWEEP_ARGS
# passes more options (e.g. SWEEP_ARGS="--dataset cifar10-jpeg --set lr=0.01").
TRIALS ?= 20
sweep: install
	@test -n "$(ALGO)" || { echo "usage: make sweep ALGO=name [TRIALS=20] [SWEEP_ARGS=...]  (pflbench list algorithms)"; exit 2; }
	$(BIN)/pflbench sweep --algo $(ALGO) --trials $(TRIALS) $(SWEEP_ARGS)

bench: install
	mkdir -p reports
	$(BIN)/pflbench bench --json reports/bench.json

# Tables (report.md, report.tex), figures and the HTML leaderboard ($(REPORTS)/index.html) of a store.
report: install
	$(BIN)/pflbench report --results $(RESULTS) --out $(REPORTS)

# The site of every published study (results/published/: tracked in git): an index of the studies
# with their commit, machine, date and state (current, stale, failed) and each study's report, at
# $(LEADERBOARD)/index.html. LEADERBOARD_ARGS passes more options (e.g. --store ci=results/ci).
LEADERBOARD ?= $(REPORTS)/leaderboard
# The documentation site (make docs: site/) as linked from the leaderboard's pages, relative to its index.html
DOCS_URL ?= ../../site/index.html
leaderboard: install
	$(BIN)/pflbench leaderboard --published results/published --out $(LEADERBOARD) --docs-url $(DOCS_URL) $(LEADERBOARD_ARGS)

# The documentation site (MkDocs + Material, mkdocs.yml) in site/: open site/index.html, or publish the folder
# as static files (GitHub Pages) like the leaderboard. The reference pages (spec keys, CLI, algorithms,
# partitions, datasets, studies, method API) are written from the code first by a plain script,
# docs/gen_reference.py, rather than by the mkdocs-gen-files plugin: the tests run the same generator
# without MkDocs (tests/test_docs_site.py), and its output can be read and diffed as Markdown. --strict: a
# broken link, anchor or docstring reference fails the build (docs/hooks.py maps repository links).
docs: install
	$(BIN)/pip install --disable-pip-version-check -q -e ".[docs]"
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "documentation: $(abspath site)/index.html"

# The GPU loan's kit (.gpu-kit/: wheels the device image lacks and Fashion-MNIST; it needs the network and
# ../shared/data), carried to the device; its plan: benchmarks/gpu/PLAN.md.
# gpu-rehearse runs the plan's device calls on this CPU at tiny sizes as the device will run them
# (benchmarks/gpu/rehearse.py: the tree as sent, in_kit.sh's environment over the device image's packages,
# each call's limit, the pack and the returned files' limits; GPU_OUT: where rehearse.json and what each call
# returned go), then the test that a sibling import planted in column.py fails it.
GPU_OUT ?= reports/gpu-rehearsal
# The calls rehearsed (rehearse.py --steps): every one before a loan; CI leaves out `check` (.ci/run).
GPU_REHEARSE_STEPS ?= verdict,column,check,cifar
gpu-kit: install
	$(BIN)/python benchmarks/gpu/kit.py

# Before a loan's first call, gpu-aside moves the tracked folders a loan leaves behind (rehearse.LEFT_BEHIND: the
# CPU cells' carried checkpoints) out of the working tree into .gpu-aside/ (git-ignored, never carried), so the
# tree and the kit fit the device's 64 MiB as kit.py counts them; gpu-back returns them after the loan
# (benchmarks/gpu/aside.py).
gpu-aside:
	python3 benchmarks/gpu/aside.py out

gpu-back:
	python3 benchmarks/gpu/aside.py back

gpu-rehearse: gpu-kit
	# the cifar10-jpeg loan's kit, where the mirror has its archive (rehearse.py skips that call otherwise)
	if [ -f "$${PFLBENCH_DATA_MIRROR:-../shared/data}/cifar10-jpeg.zip" ]; then \
	    $(BIN)/python benchmarks/gpu/kit.py --kit .gpu-kit-cifar --datasets cifar10-jpeg; fi
	PYTHON=$(BIN)/python $(BIN)/python benchmarks/gpu/rehearse.py --out $(GPU_OUT) --steps $(GPU_REHEARSE_STEPS)
	PYTHON=$(BIN)/python $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_gpu_rehearse.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache site docs/reference docs/repo
