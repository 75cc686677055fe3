# Two commands on a fresh machine: `make demo` and `make test`. All local state lives in .trainpipe/.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export TRAINPIPE_HOME := $(CURDIR)/.trainpipe
export AIRFLOW_HOME := $(TRAINPIPE_HOME)/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__UNIT_TEST_MODE := False
export MLFLOW_TRACKING_URI := sqlite:///$(TRAINPIPE_HOME)/mlflow.db
export TRAINPIPE_MLFLOW_ARTIFACT_ROOT := $(TRAINPIPE_HOME)/mlartifacts
export MLFLOW_DISABLE_TELEMETRY := true
export GX_ANALYTICS_ENABLED := false
export TORCH_EXTENSIONS_DIR := $(TRAINPIPE_HOME)/torch_extensions

DEMO_DATE ?= $(shell date -u +%Y-%m-%d)

.PHONY: install demo test test-fast clean stack stack-down stack-status stack-deps

install: $(STAMP)

# requirements.lock pins every transitive version that is known to install together here, so the
# resolver does no backtracking; torch==2.13.0 is the CPU build (any other torch pulls CUDA wheels).
$(STAMP): pyproject.toml trainer_image/pyproject.toml requirements.lock
	@mkdir -p $(TRAINPIPE_HOME)
	@echo "installing into $(VENV) (a few minutes on a fresh machine; log: $(TRAINPIPE_HOME)/install.log)"
	$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --progress-bar off -c requirements.lock "torch==2.13.0" \
		-e "./trainer_image[deepspeed,tracking,tuning]" -e ".[kubernetes,amazon,dev,stack]" > $(TRAINPIPE_HOME)/install.log 2>&1 \
		|| { tail -40 $(TRAINPIPE_HOME)/install.log; exit 1; }
	touch $(STAMP)

demo: install
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/trainpipe demo-data --end $(DEMO_DATE)
	$(BIN)/airflow db migrate > $(TRAINPIPE_HOME)/db-migrate.log 2>&1
	$(BIN)/airflow dags test fraud_detector $(DEMO_DATE)
	@echo
	@$(BIN)/trainpipe model fraud_detector --alias champion
	@echo
	@echo "Airflow UI: AIRFLOW_HOME=$(AIRFLOW_HOME) AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags $(BIN)/airflow standalone   (then http://localhost:8080)"
	@echo "MLflow UI:  $(BIN)/mlflow ui --backend-store-uri $(MLFLOW_TRACKING_URI) --port 5000   (then http://localhost:5000)"
	@echo "Evaluation report (per region too): MLflow UI -> experiment trainpipe/fraud_detector -> the run -> Artifacts -> evaluation/report.html"

# The `stack` tier (tests/stack) starts its own stack (temporary state, free ports) and stops it at the end.
test: install stack-deps
	$(BIN)/python -m pytest tests -q

test-fast: install
	$(BIN)/python -m pytest tests -q -m "not integration and not slow and not stack"

# The native stack (README "Run the stack"): PostgreSQL, Redis, S3 (moto), MLflow server, Airflow with
# Celery, on 127.0.0.1 with all state in .trainpipe/stack/. PostgreSQL and Redis are OS packages,
# installed with apt-get when missing and running as root on Debian (as CI does).
stack-deps:
	@if ! command -v redis-server >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing postgresql and redis-server with apt-get"; \
			apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				--no-install-recommends postgresql redis-server >/dev/null; \
		else \
			echo "the stack needs PostgreSQL and Redis: install the postgresql and redis-server packages"; exit 1; \
		fi; \
	fi

stack: install stack-deps
	$(BIN)/python -m trainpipe.stack up

stack-down:
	$(BIN)/python -m trainpipe.stack down

stack-status:
	$(BIN)/python -m trainpipe.stack status

clean:
	@# a running stack keeps its state in $(TRAINPIPE_HOME)/stack: stop it first
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m trainpipe.stack down >/dev/null 2>&1 || true; fi
	rm -rf $(TRAINPIPE_HOME)
