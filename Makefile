# Two commands on a fresh machine: `make demo` and `make test`. All local state lives in .trainpipe/.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

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

.PHONY: install demo test test-fast lint docs clean stack stack-down stack-status stack-deps browser-deps

install: $(STAMP)

# Airflow's own commands warn on every `airflow dags test` (make demo) without these: its CLI when it
# cannot import graphviz (airflow.utils.dot_renderer), and starlette (1.10 here), whose testclient (imported
# by svcs, which Airflow's execution API uses) deprecates httpx in favour of httpx2. Pure Python;
# nothing of trainpipe imports them.
AIRFLOW_QUIET := graphviz httpx2

# requirements.lock pins every transitive version that is known to install together here, so the
# resolver does no backtracking; torch==2.13.0 is the CPU build (any other torch pulls CUDA wheels).
# uv installs the same pins in about a minute (pip took five); tools/uv_index_args.py hands it the indexes,
# find-links and constraints of pip's configuration, which uv does not read.
UV = $(BIN)/uv pip install --python $(BIN)/python -c requirements.lock $(shell $(PYTHON) tools/uv_index_args.py)

$(BIN)/uv:
	@mkdir -p $(TRAINPIPE_HOME)
	$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --progress-bar off -c requirements.lock uv > $(TRAINPIPE_HOME)/install.log 2>&1 \
		|| { tail -40 $(TRAINPIPE_HOME)/install.log; exit 1; }

$(STAMP): pyproject.toml trainer_image/pyproject.toml requirements.lock | $(BIN)/uv
	@echo "installing into $(VENV) (a minute or two on a fresh machine; log: $(TRAINPIPE_HOME)/install.log)"
	@$(UV) "torch==2.13.0" $(AIRFLOW_QUIET) -e "./trainer_image[deepspeed,tracking,tuning,transformers]" \
		-e ".[kubernetes,amazon,tuning]" >> $(TRAINPIPE_HOME)/install.log 2>&1 \
		|| { tail -40 $(TRAINPIPE_HOME)/install.log; exit 1; }
	touch $(STAMP)

# What only `make test` and `make stack` need: test tools and the stack's Celery/Postgres clients. The
# benchmark extra (dag-factory) is installed by hand (benchmarks/parse_specs.py), never by make.
$(DEV_STAMP): $(STAMP)
	@$(UV) "torch==2.13.0" -e "./trainer_image[deepspeed,tracking,tuning,transformers]" -e ".[kubernetes,amazon,tuning,dev,stack]" \
		>> $(TRAINPIPE_HOME)/install.log 2>&1 || { tail -40 $(TRAINPIPE_HOME)/install.log; exit 1; }
	touch $(DEV_STAMP)

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
# Two workers (TEST_WORKERS=0 for one process); tests/conftest.py keeps what shares a fixture on one worker
# and hands out the longest groups first.
TEST_WORKERS ?= 2
test: $(DEV_STAMP) stack-deps browser-deps
	$(BIN)/python -m pytest tests -q --durations=30 -n $(TEST_WORKERS) --no-loadscope-reorder

# The unit tier (docs/testing.md says what it covers): no torchrun, no Airflow server, no pipeline.
test-fast: $(DEV_STAMP)
	$(BIN)/python -m pytest tests -q -m "not integration and not slow and not stack" -n $(TEST_WORKERS) \
		--no-loadscope-reorder --durations=10

# Static checks: ruff, the import contracts (.importlinter), mypy on the typed packages ([tool.mypy]).
lint: $(DEV_STAMP)
	$(BIN)/ruff check provider trainer_image tests benchmarks tools dags examples
	$(BIN)/lint-imports
	$(BIN)/mypy -p trainpipe.spec -p trainpipe.plan -p trainpipe.compile -m trainpipe_trainer.config \
		-m trainpipe_trainer.run_layout -m trainpipe_trainer.outcomes -m trainpipe_trainer.resume

# The docs site (mkdocs.yml): the spec field reference regenerated from the schema, then a strict
# build (a broken link or anchor fails) into .trainpipe/site/. NO_MKDOCS_2_WARNING: the theme's
# end-of-life banner is not about this site.
docs: $(DEV_STAMP)
	$(BIN)/python tools/gen_spec_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "site: $(TRAINPIPE_HOME)/site/index.html"

# The native stack (docs/operations.md): PostgreSQL, Redis, S3 (moto), MLflow server, Airflow with
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

# The fleet view's browser test drives Debian's chromium through its chromium-driver (never a downloaded browser).
browser-deps:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing chromium and chromium-driver with apt-get"; \
			apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				--no-install-recommends chromium chromium-driver >/dev/null; \
		else \
			echo "the browser test needs Debian's chromium and chromium-driver packages"; exit 1; \
		fi; \
	fi

stack: $(DEV_STAMP) stack-deps
	$(BIN)/python tools/stack/trainpipe_stack.py up

stack-down:
	$(BIN)/python tools/stack/trainpipe_stack.py down

stack-status:
	$(BIN)/python tools/stack/trainpipe_stack.py status

clean:
	@# a running stack keeps its state in $(TRAINPIPE_HOME)/stack: stop it first
	@if [ -x $(BIN)/python ]; then $(BIN)/python tools/stack/trainpipe_stack.py down >/dev/null 2>&1 || true; fi
	rm -rf $(TRAINPIPE_HOME)
