# The two entry points of the README: `make run` and `make test`. Both set everything up.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: run test test-fast test-dali lint setup setup-dali system bench clean

run: setup
	$(BIN)/automlperf run

# Five pytest-xdist workers on any machine: much of the suite waits on processes, servers and
# jobs; two workers left a 2-core machine idle for a third of the run, four for 6-7 % of it,
# mostly while three waited at once (bench/RESULTS.md, "The test suite"). A module's SLURM
# tests share a worker, the slow tests go first, and SLURM's alternate with the others
# (tests/conftest.py).
TEST_WORKERS ?= 5
# pytest keeps the test modules' rewritten bytecode only where Python may write bytecode;
# where PYTHONDONTWRITEBYTECODE is set (as on CI), every worker of every run rewrites them all
# again: collecting took 9.4-9.7 CPU-s a worker here, 4.8-4.9 with them kept.
unexport PYTHONDONTWRITEBYTECODE
# The workers' training processes share the cores: OpenMP threads that spin while they wait
# for work take the cores from the others' (two short runs side by side: 36-39 CPU-s with
# spinning threads, 24-27 with waiting ones; each run's own arithmetic unchanged).
test test-fast test-dali: export OMP_WAIT_POLICY := PASSIVE
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
FAST := not slow and not postgres and not slurm and not browser and not dali

# The whole suite, but for the tests of an optional extra (test-dali): nothing to download
# that a user does not need. `system` installs the programs once; later runs only look.
test: setup system
	$(BIN)/python -m pytest $(XDIST) --durations=20

# Day-to-day: no root, no services (PostgreSQL, SLURM, Chromium), no end-to-end runs; a
# package's own lane is its folder (`pytest tests/store`).
test-fast: setup
	$(BIN)/python -m pytest $(XDIST) -m "$(FAST)" --durations=10

# The optional NVIDIA DALI extra (a 0.5 GB download) and its tests, on DALI's CPU decoders.
test-dali: setup-dali
	$(BIN)/python -m pytest -m dali

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

# The project's own bytecode, brought up to date on every use: an editable install has none,
# and where PYTHONDONTWRITEBYTECODE is set every process of a run (primary, replicas, ranks,
# loader workers: hundreds in `make test`) would compile the modules it imports again.
setup: $(VENV)/.ready
	$(BIN)/python -m compileall -q src > /dev/null

$(VENV)/.ready: pyproject.toml scripts/setup-venv.sh
	VENV=$(VENV) PYTHON=$(PYTHON) scripts/setup-venv.sh
	touch $@

# NVIDIA DALI (the `dali` extra, about 0.5 GB): its own GPU pipeline (data.dali), and the `dali` tests, which run
# its CPU decoders on any machine.
setup-dali: setup
	$(BIN)/python -m pip --disable-pip-version-check -q install -e ".[test,dali]"

system:
	scripts/setup-system.sh

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
