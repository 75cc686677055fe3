"""The ``train`` step: the trainer config of a DAG run, the launch, the result (``train``); the same training outside
Airflow (``standalone``: ``trainpipe train``) and again from a registered version's lineage (``reproduce``)."""
