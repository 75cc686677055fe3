"""One process at a time creates a new SQLite MLflow store.

MLflow creates a SQLite store's tables (and runs its migrations) in whichever process first opens it,
with no lock: two tasks that start together on a new store (the embedded default's first runs) both
migrate, and all but one fail (``Online migration expected to match one row``, ``table ... already
exists``). The provider's hook and the trainer open the store through ``prepare_store`` first."""

from __future__ import annotations

import fcntl
from pathlib import Path

_SQLITE = "sqlite:///"


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for any other store (and in-memory ones)."""
    if not uri.startswith(_SQLITE):
        return None
    path = uri[len(_SQLITE):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def prepare_store(uri: str) -> None:
    """Open the tracking and registry stores of ``uri`` under a file lock beside the database, so the process
    that creates the tables is the only one doing it; the others then find them. A no-op for other stores."""
    database = _sqlite_file(uri)
    if database is None:
        return
    import mlflow

    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            # MLflow keeps each store per process: the later calls of this process reuse them.
            client = mlflow.MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)
            client.search_registered_models(max_results=1)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
