# Quick start: `make plan` and `make test`; each sets up its own virtual environment.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: plan test setup bench lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,harness]"
	touch $(STAMP)

setup: $(STAMP)

plan: $(STAMP)
	$(BIN)/plan --framework megatron-2022

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_search.py

lint: $(STAMP)
	$(BIN)/ruff check perfmodel search hardware_specs harness tests

clean:
	rm -rf $(VENV) build *.egg-info
