"""Airflow listeners of the trainpipe provider (registered by ``trainpipe.plugin``)."""
