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
# make test's pytest-xdist workers: each starts a control plane of its own; the tests mostly wait on it, so more
# workers than cores pays (measured on 2 cores: see docs/development.md)
TEST_WORKERS ?= 3
DEMO_ARGS ?=

.PHONY: install test unit lint demo bench crd render images clean controlplane

# The real control plane under the tests and the demo: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler built from their Go modules (controlplane/go.mod pins them) into controlplane/bin, once: the
# stamp holds go.sum's hash, so a changed pin rebuilds and an unchanged one is reused.
CP_DIR   := controlplane
CP_BIN   := $(CP_DIR)/bin
# The version the binaries report (kube-apiserver's /version, which Helm checks a chart's kubeVersion against):
# k8s.io/kubernetes' pin, stamped as its hack/lib/version.sh does; without it they say v0.0.0-master.
CP_K8S   := $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2; exit}' $(CP_DIR)/go.mod 2>/dev/null)
CP_MAJOR_MINOR := $(subst ., ,$(patsubst v%,%,$(CP_K8S)))
CP_LDFLAGS := -s -w $(foreach pkg,k8s.io/client-go/pkg/version k8s.io/component-base/version,\
              -X $(pkg).gitVersion=$(CP_K8S) -X $(pkg).gitMajor=$(word 1,$(CP_MAJOR_MINOR)) \
              -X $(pkg).gitMinor=$(word 2,$(CP_MAJOR_MINOR)) -X $(pkg).gitTreeState=clean)
CP_STAMP := $(CP_BIN)/.built-$(shell (cat $(CP_DIR)/go.sum; echo '$(CP_LDFLAGS)') 2>/dev/null | sha256sum | cut -c1-16)
CP_CMDS  := etcd:./cmd/etcd kube-apiserver:k8s.io/kubernetes/cmd/kube-apiserver \
            kube-controller-manager:k8s.io/kubernetes/cmd/kube-controller-manager \
            kube-scheduler:k8s.io/kubernetes/cmd/kube-scheduler

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

install: $(STAMP) $(CHECKOV_STAMP) controlplane

controlplane: $(CP_STAMP)

$(CP_STAMP): $(CP_DIR)/go.mod $(CP_DIR)/go.sum $(CP_DIR)/cmd/etcd/main.go
	@mkdir -p $(CP_BIN)
	@echo "control plane: downloading the pinned modules (first time: about a minute)"
	cd $(CP_DIR) && go mod download
	@set -e; for pair in $(CP_CMDS); do \
	  name=$${pair%%:*}; pkg=$${pair#*:}; start=$$(date +%s); \
	  echo "control plane: building $$name (the first build of all four: about 10 minutes on 2 cores)"; \
	  (cd $(CP_DIR) && go build -trimpath -buildvcs=false -ldflags='$(CP_LDFLAGS)' -o bin/$$name $$pkg); \
	  echo "control plane: $$name built in $$(( $$(date +%s) - start ))s"; \
	done
	@rm -f $(CP_BIN)/.built-*
	@touch $@

test: install lint
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The inner loop: the pure tests, no servers (under a minute: 45 s on 2 cores with two workers, 62 s with one).
unit: $(STAMP)
	$(PY) -m pytest -q -rs -n 2 tests/unit $(PYTEST_ARGS)

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
	rm -rf $(VENV) $(CHECKOV_VENV) $(CP_BIN) .pytest_cache .mypy_cache .ruff_cache
