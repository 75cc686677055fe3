"""Stage 3: the Airflow-free plan (the contract past the spec), run parameters, the launch command."""
