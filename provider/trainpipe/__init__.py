"""trainpipe: an Airflow provider with a DAG factory for ML training pipelines.

Importing this package must stay cheap and must never import torch: DAG files import it at parse time.
"""

__version__ = "0.1.0"
