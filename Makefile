# flashsend — every target does the set-up it needs; re-running is fast (nothing re-downloaded).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-unit lint typecheck up down clean docs browser screenshots

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

# The console's browser tests and screenshots drive the system's headless Chromium (Debian
# packages chromium and chromium-driver), installed here when missing.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "installing chromium and chromium-driver (the console's browser tests)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  { $$SUDO apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -q >/dev/null 2>&1 && \
	      $$SUDO apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }; } || \
	  { echo "make: cannot install chromium: run 'apt-get install chromium chromium-driver' as root (Debian) and re-run make" >&2; exit 1; }; }

# Most integration tests wait (on workers, brokers, the stand-in) more than they compute, so
# the suite runs in TEST_WORKERS processes, each with its own stack on free ports.
TEST_WORKERS ?= 3

test: setup lint browser
	$(BIN)/flashsend schemas check --offline
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# docs/img/console-*.png, the README's screenshots: the console in the same browser as the tests.
screenshots: setup browser
	@mkdir -p docs/img
	FLASHSEND_SCREENSHOTS_DIR=$(CURDIR)/docs/img $(BIN)/pytest -q -p no:cacheprovider \
	  tests/integration/test_console_screenshots.py

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
