"""One morning after a night of retrains (``night.write_night``) for the fleet tests: trainpipe DAGs serialized
into the session's Airflow DB, their runs written through Airflow's REST API (the api-server's app in process),
MLflow written with its client. Users: ``admin`` (Airflow admin) and ``riskonly`` (reads the fraud_* DAGs only)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .night import PASSWORD, USER, VIEWER, VIEWER_PASSWORD, Night, serialize_dags, write_night

JWT_SECRET = "fleet-tests-" + "0123456789abcdef" * 4


@dataclass
class Fleet:
    client: Any  # fastapi TestClient on Airflow's api-server app
    night: Night
    env: dict[str, str]

    def token(self, user: str = USER, password: str = PASSWORD) -> str:
        answer = self.client.post("/auth/token", json={"username": user, "password": password})
        assert answer.status_code == 201, answer.text
        return answer.json()["access_token"]

    def headers(self, user: str = USER, password: str = PASSWORD) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(user, password)}"}


def configure_airflow_auth(state_dir: Path) -> dict[str, str]:
    """The auth settings, in the environment (for a server process) and in this process's Airflow config."""
    from airflow.configuration import conf

    passwords = state_dir / "fleet-passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD, VIEWER: VIEWER_PASSWORD}))
    settings = {"auth_manager": "fleet.auth.TeamAuthManager", "simple_auth_manager_users": f"{USER}:admin,{VIEWER}:viewer",
                "simple_auth_manager_passwords_file": str(passwords)}
    for key, value in settings.items():
        conf.set("core", key, value)
    # A key of the length SHA512 wants (a short generated one makes PyJWT warn on every token).
    conf.set("api_auth", "jwt_secret", JWT_SECRET)
    return {**{f"AIRFLOW__CORE__{key.upper()}": value for key, value in settings.items()},
            "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET}


@pytest.fixture(scope="package")
def fleet(airflow_db: Path, state_dir: Path) -> Iterator[Fleet]:
    import warnings

    with warnings.catch_warnings():
        # Starlette deprecates its httpx-based client in favour of httpx2, which is not installed here.
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app

    tests = Path(__file__).resolve().parents[1]
    # The api-server imports the test auth manager (tests/fleet/auth.py), whose helpers reach tools/stack.
    env = {**os.environ, **configure_airflow_auth(state_dir),
           "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent / "tools" / "stack"),
                                          os.environ.get("PYTHONPATH", "")])}
    serialize_dags(state_dir / "fleet_configs", env)
    with TestClient(create_app()) as client:
        fleet = Fleet(client=client, night=None, env=env)  # type: ignore[arg-type]
        fleet.night = write_night(client, fleet.headers())
        yield fleet
