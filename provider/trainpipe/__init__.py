"""trainpipe: an Airflow provider with a DAG factory for ML training pipelines.

Importing this package must stay cheap and must never import torch: DAG files import it at parse time.
"""

from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"


def load_dags(globals_dict: dict[str, Any], *, specs_folder: str | os.PathLike[str] | None = None, shards: int = 1,
              shard: int = 0) -> None:
    """Compile every spec of a folder into one Airflow DAG each, into ``globals_dict`` (the DAG file's
    ``globals()``). A DAG file in Airflow's DAGs folder needs two lines (docs/install.md)::

        from trainpipe import load_dags  # Airflow DAG file: one DAG per trainpipe spec
        load_dags(globals())

    (the comment is needed: Airflow's safe mode parses only files that mention "airflow" and "dag").

    ``specs_folder``: the folder of specs (relative to the DAG file's folder); by default
    ``TRAINPIPE_DAG_CONFIGS``, else the nearest ``dag_configs/`` in the DAG file's folder or a parent.
    Each broken spec becomes an Airflow import error of its own file; the valid ones still load.

    ``shards``/``shard``: for a large folder, ``shards`` DAG files share the specs, this one being number
    ``shard`` (0 .. shards-1; each file of the set passes the same ``shards`` and its own ``shard``).
    Up to 300 specs shard 0 compiles them all; above that each file compiles about 1/shards of them,
    chosen by a hash of the spec's path (ADR 0012; 64 files were measured).
    """
    from trainpipe.dags.files import load_dags as load

    load(globals_dict, specs_folder=specs_folder, shards=shards, shard=shard)
