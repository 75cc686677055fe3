"""Notifications of a run (gate failure, task failure, approval, promotion, deadline)."""
