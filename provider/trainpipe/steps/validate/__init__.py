"""Data checks of the validate step: Great Expectations quality and drift."""
