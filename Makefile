# Quick start: `make plan` and `make test`; each sets up its own virtual environment.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FW_STAMP := $(VENV)/.frameworks
DOCS_STAMP := $(VENV)/.docs

.PHONY: plan test setup frameworks docs bench lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,harness]"
	touch $(STAMP)

setup: $(STAMP)

# The frameworks' own packages (CPU-only, ~1 min once; cached like .venv by the stamp file):
# the launch-config tests load every emitted config through their config code.
$(FW_STAMP): $(STAMP)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,harness,frameworks]"
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt megatron-bridge
	touch $(FW_STAMP)

frameworks: $(FW_STAMP)

# mkdocs-material for the documentation site (docs/, mkdocs.yml); `make test` builds it strictly.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,harness,docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

plan: $(STAMP)
	$(BIN)/plan --framework megatron-2022

test: $(STAMP) $(FW_STAMP) $(DOCS_STAMP)
	$(BIN)/ruff check perfmodel search hardware_specs harness cli validation emit realtime plots sweep tests
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_search.py

lint: $(STAMP)
	$(BIN)/ruff check perfmodel search hardware_specs harness cli validation emit realtime plots sweep tests

clean:
	rm -rf $(VENV) build site *.egg-info
