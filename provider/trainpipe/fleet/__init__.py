"""The fleet view: every trainpipe pipeline on one page of the Airflow UI (ADR 0019).

``outcome`` turns a DAG run's facts into an outcome and a reason in words; ``collect`` assembles the rows
from Airflow's facts and batched MLflow searches, cached per DAG-run change (Airflow-free); ``airflow_state``
reads the facts from Airflow's database; ``app`` is the FastAPI app the plugin mounts at ``/trainpipe``;
``render`` its HTML pages (server-rendered, inline SVG, no JavaScript build).
"""
