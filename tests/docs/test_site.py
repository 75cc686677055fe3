"""The docs site builds strictly (every page in the nav, every link and anchor resolves), and
README stays a short front page whose links lead into docs/."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

README_MAX_LINES = 250


@pytest.mark.integration
def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    # The theme's end-of-life banner is not about this site (make docs sets the same).
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [mkdocs, "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, f"`make docs` would fail:\n{output}"
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").is_file()


def test_readme_is_short_and_its_links_resolve() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if "://" not in link and not (REPO / link).exists()]
    assert links and not missing, f"README links to files that do not exist: {missing}"


def test_readme_keeps_the_two_commands_and_the_pip_path() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test", "docs"):
        assert f"make {target}" in text and re.search(rf"^{target}:", makefile, re.MULTILINE), target
    assert "pip install airflow-provider-trainpipe" in text
    # The DAG file as a user copies it: its comment names "airflow" and "dag", which Airflow's safe mode
    # looks for before it parses a file.
    dag_file = re.search(r"```python\n(from trainpipe import load_dags.*?)```", text, re.DOTALL)
    assert dag_file, "README shows no DAG file"
    lines = dag_file.group(1).strip().splitlines()
    assert [line.split("#")[0].strip() for line in lines] == ["from trainpipe import load_dags", "load_dags(globals())"]
    assert "airflow" in dag_file.group(1).lower() and "dag" in dag_file.group(1).lower()
