"""No spec text is ever a template (issue 20): every free-text field of a spec carries
``{{ conn.leak.password }}`` and a ``{% ... %}`` block, the connection ``leak`` is defined by an
``AIRFLOW_CONN_LEAK`` environment variable with a known password, and every task of the compiled
DAGs is rendered by the real ``airflow tasks render``. The literal text survives and the password
never appears. A control DAG in the same folder renders the same expression in a BashOperator and
does show the password, so its absence elsewhere is trainpipe's doing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import REPO, copy_airflow_db
from trainpipe.compile.compiler import compile_directory
from trainpipe.settings import Settings

PASSWORD = "pw-3f9c1e-never-shown"
EXPRESSION = "{{ conn.leak.password }}"
BLOCK = "{% for c in [1] %}{{ conn.leak.password }}{% endfor %}"
PAYLOAD = f"x {EXPRESSION} {BLOCK}"
CONTROL = '''\
from datetime import datetime
from airflow.sdk import DAG
from airflow.providers.standard.operators.bash import BashOperator
with DAG("control_template", schedule=None, start_date=datetime(2026, 1, 1)):
    BashOperator(task_id="echo", bash_command="echo {{ conn.leak.password }}")
'''
pytestmark = pytest.mark.integration


def _kubernetes_spec() -> dict:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_multinode.yaml").read_text())
    spec.update(pipeline_id="literal_k8s", description=PAYLOAD, owner=PAYLOAD, tags=[PAYLOAD])
    # A model name is a plain name (a template in it is refused: tests/spec); the payload rides elsewhere.
    spec["registration"]["model_name"] = "m_literal"
    k = spec["training"]["kubernetes"]
    # Label, node-selector, taint and affinity values, names of accounts and priority classes, and an image
    # are plain Kubernetes names or references (a template in them is refused: tests/spec/test_admission_rules.py).
    k.update(kubernetes_conn_id=PAYLOAD, labels={"team": "risk"}, annotations={"note": PAYLOAD},
             env={"NCCL_DEBUG": PAYLOAD})
    return spec


def _approval_spec() -> dict:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_approval.yaml").read_text())
    spec.update(pipeline_id="literal_approval", description=PAYLOAD, owner=PAYLOAD, tags=[PAYLOAD])
    # A model name is a plain name (a template in it is refused: tests/spec); the payload rides elsewhere.
    spec["registration"]["model_name"] = "m_literal"
    # An address is one plain address (a template in it is refused: tests/notifications/test_email_recipients.py).
    spec["notify"]["email"].update(to=["risk-ml@example.com"], from_email="trainpipe@example.com")
    for param in spec["params"].values():
        param["description"] = PAYLOAD
    return spec


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, airflow_db_template: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("literal")
    (root / "specs").mkdir()
    (root / "dags").mkdir()
    for name, spec in (("k8s.yaml", _kubernetes_spec()), ("approval.yaml", _approval_spec())):
        (root / "specs" / name).write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "dags" / "trainpipe_dags.py").write_text((REPO / "dags" / "trainpipe_dags.py").read_text())
    (root / "dags" / "control.py").write_text(CONTROL)
    env = {**os.environ,
           "AIRFLOW_HOME": str(root / "airflow"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{root / 'airflow.db'}",
           "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
           "TRAINPIPE_DAG_CONFIGS": str(root / "specs"),
           "TRAINPIPE_HOME": str(root / "home"),
           "AIRFLOW_CONN_LEAK": f'{{"conn_type": "generic", "login": "u", "password": "{PASSWORD}"}}'}
    airflow = str(Path(sys.executable).with_name("airflow"))
    copy_airflow_db(airflow_db_template, root / "airflow.db")
    subprocess.run([airflow, "dags", "reserialize"], check=True, capture_output=True, env=env, timeout=600)
    return root, env


# `airflow tasks render` for many tasks in one process: the CLI's own parser and command, so each
# render is exactly the command's, without paying Airflow's start-up once per task.
RENDER_ALL = """
import contextlib, io, json, sys
from airflow.cli.cli_parser import get_parser
out = {}
for dag_id, task_id in json.loads(sys.argv[1]):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        args = get_parser().parse_args(["tasks", "render", dag_id, task_id, "2026-01-01"])
        args.func(args)
    out[f"{dag_id}.{task_id}"] = buffer.getvalue()
print(json.dumps(out))
"""


def _render(env: dict[str, str], tasks: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    result = subprocess.run([sys.executable, "-c", RENDER_ALL, json.dumps(tasks)], capture_output=True, text=True,
                            env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert PASSWORD not in result.stderr
    rendered = json.loads(result.stdout.strip().splitlines()[-1])
    return {(dag_id, task_id): rendered[f"{dag_id}.{task_id}"] for dag_id, task_id in tasks}


def _fields(text: str) -> dict[str, str]:
    """``airflow tasks render``'s output by property (KubernetesJobOperator's field order varies per process)."""
    fields = {}
    for part in text.split("# property: ")[1:]:
        name, _, value = part.partition("\n")
        fields[name] = "\n".join(line for line in value.splitlines() if not line.startswith("# ---")).strip()
    return fields


def test_every_task_renders_spec_text_as_written(folder: tuple[Path, dict[str, str]]):
    root, env = folder
    compiled = compile_directory(root / "specs", settings=Settings.from_env())
    assert not compiled.errors, compiled.errors
    tasks = [(plan.dag_id, task.task_id) for plan in compiled.plans.values() for task in plan.tasks]
    assert {"literal_k8s", "literal_approval"} == {dag for dag, _ in tasks}
    assert ("literal_approval", "approve") in tasks and ("literal_k8s", "train") in tasks

    rendered = _render(env, [*tasks, ("control_template", "echo")])

    assert PASSWORD in rendered.pop(("control_template", "echo"))  # the connection resolves: a template would leak it
    for (dag_id, task_id), text in rendered.items():
        assert PASSWORD not in text, f"{dag_id}.{task_id} rendered the password"
    # A command-line `airflow tasks render` as well, for the two tasks with spec text in their fields.
    airflow = str(Path(sys.executable).with_name("airflow"))
    for dag_id, task_id in (("literal_k8s", "train"), ("literal_approval", "approve")):
        cli = subprocess.run([airflow, "tasks", "render", dag_id, task_id, "2026-01-01"], capture_output=True,
                             text=True, env=env, timeout=600)
        assert cli.returncode == 0, cli.stderr[-3000:]
        assert PASSWORD not in cli.stdout + cli.stderr
        assert _fields(cli.stdout) == _fields(rendered[dag_id, task_id])
    train = rendered["literal_k8s", "train"]
    for field in ("image", "labels", "annotations", "node_selector", "kubernetes_conn_id"):
        assert f"# property: {field}" in train
    assert train.count(PAYLOAD) >= 2, train  # annotations, connection id (env_vars are set when it runs)
    approve = rendered["literal_approval", "approve"]
    assert "Promote the new m_literal version to champion?" in approve, approve


def test_notifiers_send_spec_text_as_written(folder: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch):
    """Notifiers are rendered when they send, not by `airflow tasks render`: render them as Airflow
    does, with a context whose `conn` resolves the environment's connection."""
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier
    from airflow.sdk.execution_time.context import ConnectionAccessor

    from trainpipe.notifications.channels import Message, notifier

    _, env = folder
    monkeypatch.setenv("AIRFLOW_CONN_LEAK", env["AIRFLOW_CONN_LEAK"])
    plan = next(p for p in compile_directory(folder[0] / "specs",
                                             settings=Settings.from_env()).plans.values() if p.dag_id == "literal_approval")
    (channel,) = plan.notify.channels
    message = Message(subject=f"[trainpipe] {PAYLOAD}", text=f"model {PAYLOAD}")
    context = {"conn": ConnectionAccessor()}

    sent = notifier(channel, message)
    sent.render_template_fields(context)
    control = SmtpNotifier(to=[f"{PAYLOAD}@example.com"], subject=message.subject)
    control.render_template_fields(context)

    assert PASSWORD in control.subject and PASSWORD in control.to[0]
    assert sent.to == ["risk-ml@example.com"] and sent.from_email == "trainpipe@example.com"
    assert sent.subject == message.subject and BLOCK in sent.html_content
    assert PASSWORD not in repr(vars(sent))
