"""The evaluate step: metrics, candidate/champion/baseline evaluation, the report, the gate table."""
