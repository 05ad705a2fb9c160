# chipledger — two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PORT   ?= 8000
WITNESS_NAME ?= localhost/witness
WITNESS_PORT ?= 8099
STAMP  := $(VENV)/.installed
TEST_VAR_DIR ?= $(CURDIR)/var/test
# Every file `make run` writes (database, keys, broker, beat's schedule, gunicorn's control socket).
VAR_DIR ?= $(or $(CHIPLEDGER_VAR_DIR),$(CURDIR)/var)
export CHIPLEDGER_VAR_DIR := $(VAR_DIR)

.PHONY: run serve test install setup bench clean aics-venv

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

# Migrate, create the ledger key, seed the demo, sign a checkpoint.
setup: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py ledger_open > /dev/null
	$(PY) manage.py seed_demo
	$(PY) manage.py ledger_checkpoint > /dev/null
	@# The demo's own C2SP tlog-witness (Procfile: witness): its key, registered on the ledger once.
	$(PY) -m ledger.witness --print-key --key-file $(VAR_DIR)/witness.key --name $(WITNESS_NAME) > $(VAR_DIR)/witness.vkey
	$(PY) manage.py register_witness "$$(cat $(VAR_DIR)/witness.vkey)" 2>/dev/null || echo "witness already registered"

# Web (gunicorn) + Celery worker + Celery beat + the witness, in the foreground (bin/serve); Ctrl-C stops all four.
define SERVE
	@echo ""
	@echo "  chipledger is starting on http://127.0.0.1:$(PORT)/"
	@echo "    admin      http://127.0.0.1:$(PORT)/admin/"
	@echo "    API docs   http://127.0.0.1:$(PORT)/api/docs/"
	@echo "    checkpoint http://127.0.0.1:$(PORT)/api/ledger/checkpoint"
	@echo "    health     http://127.0.0.1:$(PORT)/healthz"
	@echo "    verifier   $(PY) -m ledger.verify --url http://127.0.0.1:$(PORT)"
	@echo "    tiles      http://127.0.0.1:$(PORT)/tlog/checkpoint  (C2SP tlog-tiles; witness on :$(WITNESS_PORT))"
	@echo ""
	@PORT=$(PORT) WITNESS_PORT=$(WITNESS_PORT) WITNESS_NAME=$(WITNESS_NAME) bin/serve 2>&1 || true
endef

run: setup
	$(SERVE)

# The same without setup (a database already migrated, a ledger key, the witness key).
serve: install
	$(SERVE)

# Tests keep every file of their own under var/test (database, broker, keys): a running `make run` is never touched.
# TEST_VAR_DIR moves them (CI runs its legs two at a time, each in a folder of its own).
test: install
	CHIPLEDGER_VAR_DIR=$(TEST_VAR_DIR) $(PY) -m pytest $(PYTEST_ARGS)

# The independent C2SP client the tile tests run (aics-tlog needs Python >= 3.12; tests/ledger/independent_client.py).
aics-venv: install
	$(PY) -c "from tests.ledger.independent_client import venv_python; print(venv_python())"

bench: install
	$(PY) bench/ledger.py

clean:
	rm -rf $(VENV) var
