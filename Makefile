# The two commands: `make run` (the platform on embedded defaults) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_DB ?= activate
export TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/$(TEST_DB)
export TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

.PHONY: run demo test venv build-deps services cluster identity sentinel browser session-tools lint typecheck pytest bench drills clean

$(BIN)/activate-installed: pyproject.toml cli/pyproject.toml
	@$(MAKE) --no-print-directory build-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet -e ./cli
	touch $@

venv: $(BIN)/activate-installed

# python-ldap (django-auth-ldap's) has no wheels: it compiles against OpenLDAP's and Cyrus SASL's
# headers, with a C compiler and Python's own headers. Debian's packages, as root, when missing.
build-deps:
	@missing=""; \
	for pkg in libldap2-dev libsasl2-dev; do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
	$(PYTHON) -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	  || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  echo "[build-deps] installing$$missing"; \
	  $$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing >/dev/null; \
	fi

run: venv
	$(BIN)/python scripts/run.py

# A first run: local Slurm (needs root), make run's platform, the cluster registered, a demo user.
demo: venv
	$(BIN)/python scripts/demo.py

services:
	bash scripts/services.sh

browser:
	bash scripts/browser.sh

cluster:
	bash scripts/testcluster.sh up

# The identity tests' services: the OpenID provider's packages (scripts/idp, from its lock file,
# again when it changed) and the LDAP directory (scripts/directory.sh).
IDP_INSTALLED := scripts/idp/node_modules/.package-lock.json
$(IDP_INSTALLED): scripts/idp/package.json scripts/idp/package-lock.json
	@command -v npm >/dev/null || { echo "make identity: needs Node.js 20 or later (node, npm)" >&2; exit 1; }
	cd scripts/idp && npm ci --silent
	touch $@

identity: $(IDP_INSTALLED)
	bash scripts/directory.sh up

# Redis under Sentinel for its failover tests (scripts/sentinel.sh): a master, a replica and three
# sentinels of their own, put back in their known state when a test left them failed over.
sentinel:
	bash scripts/sentinel.sh up

# What sessions run on the test node: TigerVNC, noVNC, websockify, xterm; code-server and
# JupyterLab (each cached).
session-tools:
	bash scripts/session-tools.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy activate core schedulers identity workers_app agents files_app sessions_app notices_app node harness bench drills
	$(BIN)/mypy --config-file cli/pyproject.toml cli/src

# Most tests in PYTEST_WORKERS processes (pytest-xdist; each its own database, Redis number and
# installation id), a file at a time in the order tests/conftest.py gives (what a module shares
# is set up once), then those that stop what all share (sshd, slurmctld) alone. Both run
# whatever the first said; a part with no test of PYTEST_ARGS in it (exit 5) is no failure.
PYTEST_WORKERS ?= 3
pytest: venv
	@export DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL); status=0; \
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" $(PYTEST_ARGS) || status=$$?; \
	[ $$status -eq 5 ] && status=0; \
	$(BIN)/pytest -m serial -p no:xdist $(PYTEST_ARGS) || { s=$$?; [ $$s -eq 5 ] || status=$$s; }; \
	exit $$status

test: venv services cluster identity sentinel browser session-tools lint typecheck pytest

# Benchmarks and drills own their database and Redis number: they delete the workers in them.
bench: venv services cluster
	DATABASE_URL=postgres://postgres@127.0.0.1:5432/activate_bench REDIS_URL=redis://127.0.0.1:6379/5 \
		$(BIN)/python -m bench

# DRILLS names some of them (default: all; CI runs a few, .ci/run).
drills: venv services cluster
	DATABASE_URL=postgres://postgres@127.0.0.1:5432/activate_drills REDIS_URL=redis://127.0.0.1:6379/6 \
		$(BIN)/python -m drills $(DRILLS)

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
