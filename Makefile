# Ticktable: `make run` starts a live demo, `make test` runs everything from a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lint proto java-check clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $(STAMP)

java-check:
	@$(BIN)/python -m ticktable.java_check

run: $(STAMP)
	$(BIN)/ticktable serve --demo

test: $(STAMP) java-check
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/bench_core.py

proto: $(STAMP)
	$(BIN)/python proto/generate.py

lint: $(STAMP)
	$(BIN)/ruff check engine flight clients ticktable tests bench examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .hypothesis
