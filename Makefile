# The whole setup is two commands: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install lint bench stress conformance clean

# Two distributions, both editable: the library (resilience/pyproject.toml) and the platform.
$(STAMP): pyproject.toml resilience/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./resilience -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/jobs up

lint: install
	$(BIN)/ruff check jobs resilience tests bench deploy conformance beat_schedule.py

test: install lint
	./scripts/ensure-chromium
	./scripts/ensure-prometheus
	./scripts/ensure-pgbouncer
	PYTHON=$(BIN)/python ./scripts/run-tests

bench: install
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m bench baseline

# Long soaks, outside `make test`: the soak-marked tests, the transfer chaos test 50
# times in a row, and the scale bench (cleanup against 10k inserts/s for 60 s).
stress: install
	$(BIN)/python -m pytest -m soak
	$(BIN)/python -m bench chaos --runs 50
	$(BIN)/python -m bench scale --seconds 60
	$(BIN)/python -m conformance

# kombu's and Celery's own suites (their PyPI source releases, cached in .data/conformance),
# stock and with the platform's transport, task class and consumer: both tallies and every
# unexplained divergence (conformance/divergences.toml lists the intended ones). Not in
# `make test`; part of `make stress`.
conformance: install
	$(BIN)/python -m conformance

clean:
	rm -rf $(VENV) .data artifacts
