"""`make demo` prints no foreign warnings: the modules `airflow dags test` imports warn when the demo's
install lacks graphviz (Airflow's CLI) or httpx2 (starlette's testclient, imported through svcs by
Airflow's execution API). The Makefile installs both (AIRFLOW_QUIET)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# The imports of `airflow dags test` that warned, in a fresh interpreter (nothing imported before).
PROBE = """
import sys
for blocked in sys.argv[1:]:
    sys.modules[blocked] = None  # as if the package were not installed
import airflow.cli.commands.dag_command
import svcs.fastapi
"""
# Airflow routes warnings to its log (py.warnings), so the probe reads what the process prints.
WARNING_MARKERS = ("Warning", "[warning")


def _warnings_of_demo_imports(*blocked: str) -> list[str]:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, *blocked], capture_output=True, text=True, timeout=300, check=False
    )
    assert probe.returncode == 0, probe.stderr
    printed = (probe.stdout + probe.stderr).splitlines()
    return [line for line in printed if any(marker in line for marker in WARNING_MARKERS)]


def test_airflow_dags_test_imports_warn_nothing() -> None:
    assert _warnings_of_demo_imports() == []


def test_the_probe_sees_the_warnings_when_the_packages_are_missing() -> None:
    printed = "\n".join(_warnings_of_demo_imports("graphviz", "httpx2"))
    assert "Could not import graphviz" in printed
    assert "install `httpx2` instead" in printed
