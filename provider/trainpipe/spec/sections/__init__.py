"""The spec's pydantic models, one module per section of the spec."""
