# flashsend — every target does the set-up it needs; re-running is fast (nothing re-downloaded).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-unit lint typecheck up down clean docs

$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "flashsend needs Python >= 3.11: install it and re-run make")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP)
	$(BIN)/flashsend setup

demo: setup
	$(BIN)/flashsend up
	$(BIN)/flashsend demo $(DEMO_ARGS)

# Most integration tests wait (on workers, brokers, the stand-in) more than they compute, so
# the suite runs in TEST_WORKERS processes, each with its own stack on free ports.
TEST_WORKERS ?= 3

test: setup lint
	$(BIN)/flashsend schemas check --offline
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

typecheck: $(STAMP)
	$(BIN)/mypy

up: setup
	$(BIN)/flashsend up

down: $(STAMP)
	$(BIN)/flashsend down

clean: down
	rm -rf .flashsend/run .flashsend/kafka .flashsend/postgres .flashsend/ses

docs: $(STAMP)
	$(BIN)/flashsend docs cli
