"""The third-party libraries trainpipe's tasks import, for Airflow to load once per scheduler.

Every Airflow task is a new process, and trainpipe's tasks import heavy libraries when they run:
Great Expectations (validate), MLflow and its SQL store (train, evaluate, register, promote), MLflow's pyfunc
loader, scikit-learn's metrics and matplotlib (evaluate). On a 2-core machine that is about 15 s of CPU per
fraud_detector run, most of it on the run's critical path. With the LocalExecutor, a deployment
can have them imported once instead (Airflow >= 3.3)::

    [scheduler]
    mp_start_method = forkserver
    [core]
    mp_forkserver_preload = airflow,airflow.executors.local_executor,trainpipe.dags.preload

The executor's workers then start from a process that has imported this module, and each task
process, forked from its worker, inherits the libraries copy-on-write. Nothing else depends on
it: without the setting every task imports what it needs itself. trainpipe's own modules are not
listed, so a task always runs the provider code its DAG file imports. Upgrading one of these
libraries needs a scheduler restart, as any upgrade of the workers' environment does.
"""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)

MODULES = (
    "pyarrow.parquet",
    "pandas",
    "great_expectations",
    "mlflow",
    "mlflow.pyfunc",
    # The store behind a database tracking URI (sqlite:// by default): its ORM is most of MLflow's
    # import cost. An http:// tracking server needs none of it; importing it costs only memory then.
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "sklearn.metrics",
    # The evaluation report's plots (evaluate): about a second of imports per task otherwise.
    "sklearn.calibration",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
)


def preload(modules: tuple[str, ...] = MODULES) -> list[str]:
    """Import ``modules``; a missing or broken one is logged and skipped (each task then reports it
    when it imports it itself). Returns the modules imported."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:
            log.warning("trainpipe.dags.preload: could not import %s: %s", name, err)
        else:
            loaded.append(name)
    return loaded


preload()
