"""Triggers (run on Airflow's triggerer): they only poll and report one event with a ``status`` key."""
