# Ticktable: `make run` starts a live demo, `make test` runs everything from a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

WEB_BUILT := flight/web/static/BUILT
WEB_MODULES := web/node_modules/.package-lock.json

.PHONY: run test bench lint proto java-check chromium-check web clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $(STAMP)

java-check:
	@$(BIN)/python -m ticktable.java_check

chromium-check:
	@$(BIN)/python -m ticktable.chromium_check

# the web UI's front-end: Perspective's client from the npm registry (pinned by
# web/package-lock.json), its viewer and chart plugins from perspective-python's wheel (in the
# venv), and web/src, copied into flight/web/static (not committed); nothing is fetched at run
# time
$(WEB_MODULES): web/package.json web/package-lock.json
	@command -v npm >/dev/null || { echo "make web: npm is missing: install Node.js 18+ and npm (Debian/Ubuntu: sudo apt-get install -y nodejs npm)" >&2; exit 1; }
	cd web && npm ci --no-audit --no-fund --loglevel=error

$(WEB_BUILT): $(STAMP) $(WEB_MODULES) web/build.mjs $(wildcard web/src/*)
	PYTHON=$(BIN)/python node web/build.mjs

web: $(WEB_BUILT)

run: $(STAMP) $(WEB_BUILT)
	$(BIN)/ticktable serve --demo

# the suite on every core (pytest-xdist; Spark's tests share one worker: tests/conftest.py)
test: lint java-check chromium-check $(WEB_BUILT)
	$(BIN)/python -m pytest -n auto --dist loadgroup

bench: $(STAMP)
	$(BIN)/python bench/bench_core.py

proto: $(STAMP)
	$(BIN)/python proto/generate.py

lint: $(STAMP)
	$(BIN)/ruff check engine flight clients ticktable tests bench examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .hypothesis web/node_modules flight/web/static
