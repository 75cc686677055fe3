"""An auth manager for the fleet tests: Airflow's SimpleAuthManager, except that the user ``riskonly`` may read only
the ``fraud_*`` DAGs (SimpleAuthManager's roles are all-DAGs or nothing; per-DAG access is what a deployment's
auth manager decides, and the fleet view must follow whatever it says)."""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

from .night import VIEWER


class TeamAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if user.get_name() == VIEWER and details is not None and details.id and not details.id.startswith("fraud_"):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
