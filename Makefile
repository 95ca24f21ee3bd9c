# The whole setup is two commands: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/jobs up

lint: install
	$(BIN)/ruff check jobs resilience tests bench beat_schedule.py

test: install lint
	./scripts/ensure-chromium
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench baseline

clean:
	rm -rf $(VENV) .data artifacts
