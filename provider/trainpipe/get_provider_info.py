"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from trainpipe import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-trainpipe",
        "name": "trainpipe",
        "description": "A DAG factory for ML training pipelines: YAML spec -> snapshot, validate, train "
        "(torchrun locally or on Kubernetes), evaluate, gate, register in MLflow.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "trainpipe", "external-doc-url": "https://github.com/trainpipe/trainpipe",
             "tags": ["software"]},
        ],
        "operators": [
            {"integration-name": "trainpipe", "python-modules": [
                "trainpipe.operators.pipeline",
                # launcher kubernetes; needs the cncf.kubernetes provider (extra `kubernetes`)
                "trainpipe.operators.kubernetes",
            ]},
        ],
        "sensors": [
            {"integration-name": "trainpipe", "python-modules": ["trainpipe.sensors.checkpoint"]},
        ],
        "triggers": [
            {"integration-name": "trainpipe", "python-modules": [
                "trainpipe.triggers.checkpoint",
                "trainpipe.triggers.kubernetes",
            ]},
        ],
        "hooks": [
            {"integration-name": "trainpipe", "python-modules": ["trainpipe.hooks.mlflow"]},
        ],
    }
