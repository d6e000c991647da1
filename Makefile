# Every target installs what it needs, idempotently (a stamp file tracks the pinned lock).
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# checkov pins boto3 and others differently from requirements-dev.lock: it gets a venv of its own,
# fully pinned by requirements-checkov.lock (tests/e2e/test_checkov.py runs its executable).
CHECKOV_VENV  ?= .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: install test unit lint demo bench crd render images clean

$(STAMP): requirements-dev.lock pyproject.toml sim/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.lock
	$(PY) -m pip install -q --no-deps -e . -e ./sim
	@touch $@

$(CHECKOV_STAMP): requirements-checkov.lock
	@test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install -q -r requirements-checkov.lock
	@touch $@

install: $(STAMP) $(CHECKOV_STAMP)

test: install lint
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

# The inner loop: the pure tests, no servers (under a minute).
unit: $(STAMP)
	$(PY) -m pytest -q -rs tests/unit $(PYTEST_ARGS)

# ruff (lint and format check) over the tree; mypy --strict over the packages named in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: install
	$(VENV)/bin/redrafter-sim demo $(DEMO_ARGS)

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

crd: install
	$(VENV)/bin/redrafter-operator crd > crds/redrafter.dev_redrafterdeployments.yaml
	cp crds/redrafter.dev_redrafterdeployments.yaml charts/redrafter-operator/crds/

images:
	images/build.sh

render: install
	@for f in examples/*.yaml; do echo "# --- $$f"; $(VENV)/bin/redrafter-operator render -f $$f; done

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .pytest_cache .mypy_cache .ruff_cache
