#!/usr/bin/env bash
# The postgres service's first-start hook (/docker-entrypoint-initdb.d): one role and one database for
# Airflow's metadata (and Celery's results), one for MLflow's backend store, one for Optuna's studies. It runs only while the
# data volume is empty: changing AIRFLOW_DB_PASSWORD or MLFLOW_DB_PASSWORD in .env later needs an
# ALTER ROLE (or `docker compose down -v`, which deletes all data).
set -euo pipefail

: "${AIRFLOW_DB_PASSWORD:?set it in .env}"
: "${MLFLOW_DB_PASSWORD:?set it in .env}"

# psql variables (:'name' quotes them as SQL literals), so the passwords never pass through the shell
# into SQL text.
psql --no-psqlrc -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    --set airflow_password="$AIRFLOW_DB_PASSWORD" --set mlflow_password="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
CREATE ROLE mlflow LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER mlflow;
-- Optuna studies of tuned pipelines (TRAINPIPE_OPTUNA_STORAGE): written by Airflow's tasks and their trainers.
CREATE DATABASE optuna OWNER airflow;
SQL
