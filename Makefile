# The two entry points of the README: `make run` and `make test`. Both set everything up.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: run test setup system bench clean

run: setup
	$(BIN)/automlperf run

test: setup system
	$(BIN)/python -m pytest

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml scripts/setup-venv.sh
	VENV=$(VENV) PYTHON=$(PYTHON) scripts/setup-venv.sh
	touch $@

system:
	scripts/setup-system.sh

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
