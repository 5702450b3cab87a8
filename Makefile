# One entry point for people and CI. `make test` is the whole suite; `make run`
# sets up and starts a broker on its embedded defaults.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup codegen drift lint types layering unit test bench run clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Regenerate generated/ from spec/ (validates the catalogue first).
codegen: setup
	PYTHONPATH=codegen $(PY) -m felix_codegen

# The generated layer must be exactly what the catalogue produces.
drift: codegen
	git diff --exit-code -- generated/
	@test -z "$$(git status --porcelain -- generated/)" || \
		{ echo "untracked files in generated/: run make codegen and commit"; exit 1; }

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check codegen felix_broker felix_transport tests bench

types: setup
	$(PY) -m mypy codegen/felix_codegen felix_broker felix_transport bench

layering: setup
	$(VENV)/bin/lint-imports

unit: setup
	$(PY) -m pytest

# The whole test suite: what CI runs.
test: drift lint types layering unit

bench: setup
	$(PY) bench/codec.py
	$(PY) bench/transport.py --quick

run: setup
	$(VENV)/bin/felix-broker

clean:
	rm -rf $(VENV) .tox .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
