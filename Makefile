# gpuwarden — every target creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-test
DEMO_SCENARIO ?= scenarios/memory-pressure-low-priority.yaml

.PHONY: demo test lint bench golden gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuwarden status --source scenario:$(DEMO_SCENARIO)@2m30s
	$(BIN)/gpuwarden status --source scenario:scenarios/xid79-one-of-eight.yaml@5m
	$(BIN)/gpuwarden status --source smi-csv:scenarios/nvidia-smi-oom-night.csv

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check daemon tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run.py

# Rewrite the golden drill timelines after an intended behaviour change; review the diff.
golden: $(STAMP)
	$(BIN)/python -m tests.regen_golden

# The one command to run on a machine that has an NVIDIA GPU and driver.
gpu-check: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu
	$(BIN)/gpuwarden status --source nvml --json
	$(BIN)/gpuwarden record --out $(VENV)/gpu-check-record.yaml --duration 10s --interval 1s
	$(BIN)/gpuwarden status --source scenario:$(VENV)/gpu-check-record.yaml --json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
