"""Sensors of a trainpipe DAG."""
