"""Stage 1-2 driver: spec files, the compiler (YAML -> spec -> plan), the plan cache. Airflow-free."""
