# syntax=docker/dockerfile:1.7
# The image of every Airflow service in docker-compose.yaml (and of its MLflow server): the official
# Airflow image plus the trainpipe provider, the trainer package and torch, running as `airflow`.
# Build (docker compose does this for you):  docker build -t trainpipe-airflow:0.1.0 .

# Keep AIRFLOW_VERSION equal to apache-airflow in requirements.lock (the version CI tests).
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}

# Re-declared without a value: it keeps the one given before FROM.
ARG AIRFLOW_VERSION
# The torch CI tests with. CPU by default: the workers of this stack train small models on CPU and
# the CUDA wheels add several GB to every service's image; docker-compose.gpu.yaml builds the
# worker image with the CUDA index instead (the host then needs only the NVIDIA driver and toolkit).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Provider extras: amazon (s3:// storage, the MinIO connection), kubernetes (launcher: kubernetes),
# tuning (optuna, for tuning: specs), stack (the Celery provider and the Postgres driver that Airflow and
# the MLflow server use).
ARG PROVIDER_EXTRAS=amazon,kubernetes,tuning,stack

# /opt/airflow/auth: the admin password file (a named volume, which takes this owner when created).
USER root
RUN install -d -o airflow -g 0 -m 0770 /opt/airflow/auth
# The official image's user (UID 50000, GID 0): every build step below and every service runs as it.
USER airflow

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the index that decides CPU or CUDA; the resolver below then sees it installed.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

# The provider and trainer from this checkout, every version pinned by requirements.lock (the set CI
# tests), apache-airflow held at the image's version so pip never moves Airflow itself. The sources
# are bind-mounted, not copied: only the installed packages end up in the image. `pip check` fails
# the build on any conflict with what the base image already had.
RUN --mount=type=bind,source=.,target=/src,rw \
    pip install -c /src/requirements.lock \
        "apache-airflow==${AIRFLOW_VERSION}" \
        "torch==${TORCH_VERSION}" \
        "/src/trainer_image[tracking,s3,tuning,transformers]" \
        "/src[${PROVIDER_EXTRAS}]" \
    && pip check \
    && python -c "import trainpipe, trainpipe_trainer, torch, mlflow"

# dags/ is baked in (trainpipe_dags.py and its shard files in dags/shards/, ADR 0012); dag_configs/ is bind-mounted by
# docker-compose.yaml so that dropping a YAML file there is all it takes to add a pipeline.
COPY --chown=airflow:0 dags/ /opt/airflow/dags/

ENV TRAINPIPE_DAG_CONFIGS=/opt/airflow/dag_configs \
    TRAINPIPE_HOME=/opt/airflow/trainpipe \
    MLFLOW_DISABLE_TELEMETRY=true \
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false \
    GX_ANALYTICS_ENABLED=false \
    PYTHONUNBUFFERED=1 \
    TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
