"""``trainpipe promote / rollback / model`` as a person runs them (subprocesses on the session's MLflow store):
they move the same aliases and write the same tags as the DAG's promote task."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainpipe.plan import tracking
from trainpipe.steps.register import model_registry as registry

pytestmark = pytest.mark.integration  # each command is a process of its own


def _trainpipe(*args: str) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).with_name("trainpipe")), *args]
    return subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(), timeout=300, check=False)


def _aliases(hook, name: str) -> dict[str, int]:
    return {alias: int(v) for alias, v in hook.client.get_registered_model(name).aliases.items()}


def test_promote_rollback_and_model_from_the_command_line(hook, model_name, train_and_register):
    train_and_register("manual__1")
    train_and_register("manual__2")

    first = _trainpipe("promote", model_name, "1", "--reason", "baseline")
    second = _trainpipe("promote", model_name, "2", "--actor", "alice", "--reason", "better on the EU slice")

    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[0] == f"{model_name} version 1 is now champion (previous_champion: none)"
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[0] == f"{model_name} version 2 is now champion (previous_champion: version 1)"
    assert _aliases(hook, model_name) == {"champion": 2, "previous_champion": 1, "challenger": 2}
    tags = hook.client.get_model_version(model_name, "1").tags
    assert tags[tracking.PROMOTED_BY_TAG] == getpass.getuser()  # without --actor: the OS user
    assert tags[tracking.PROMOTION_REASON_TAG] == "baseline"
    tags = hook.client.get_model_version(model_name, "2").tags
    assert tags[tracking.PROMOTED_BY_TAG] == "alice" and tags[tracking.REPLACED_VERSION_TAG] == "1"
    assert json.loads(tags[tracking.PROMOTION_DETAILS_TAG]) == {"command": "trainpipe promote"}

    rolled = _trainpipe("rollback", model_name, "--actor", "bob", "--reason", "latency regression")

    assert rolled.returncode == 0, rolled.stderr
    assert rolled.stdout.splitlines() == [
        f"{model_name} version 1 is now champion (previous_champion: version 2)",
        f"  rolled back by bob at {hook.client.get_model_version(model_name, '1').tags[tracking.PROMOTED_AT_TAG]}: "
        "rollback: latency regression",
    ]
    assert _aliases(hook, model_name) == {"champion": 1, "previous_champion": 2, "challenger": 2}

    shown = _trainpipe("model", model_name)

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"registered model: {model_name}  (2 version(s))"
    assert lines[1] == "aliases:"
    assert lines[2].startswith("  challenger         version 2  (run manual__2, created ")
    assert lines[3].startswith("  champion           version 1  (run manual__1, created ")
    assert lines[3].endswith(", auc=0.910000, ndcg_at_10=0.500000)")
    assert lines[4].startswith("  previous_champion  version 2  (run manual__2")
    assert lines[5] == "last promotions (newest first):"
    assert lines[6].endswith("  version 1, replaced version 2  by bob: rollback: latency regression")
    assert lines[7].endswith("  version 2, replaced version 1  by alice: better on the EU slice")
    assert lines[8].endswith(f"  version 1  by {getpass.getuser()}: baseline")


def test_promoting_the_champion_again_says_nothing_moved(hook, model_name, train_and_register):
    train_and_register("manual__1")
    assert _trainpipe("promote", model_name, "1", "--actor", "alice").returncode == 0

    again = _trainpipe("promote", model_name, "1", "--actor", "bob")

    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == f"{model_name} version 1 already is champion: nothing moved"
    assert hook.client.get_model_version(model_name, "1").tags[tracking.PROMOTED_BY_TAG] == "alice"


def test_model_with_alias_shows_that_version_in_full(hook, model_name, train_and_register):
    train_and_register("manual__1")
    registry.promote(hook.client, model_name, 1, actor="dag", reason="gates passed")

    shown = _trainpipe("model", model_name, "--alias", "champion")  # what `make demo` prints

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[:3] == [f"registered model: {model_name}", "version:          1",
                         f"alias:            champion  (load with mlflow.pyfunc.load_model('models:/{model_name}@champion'))"]
    assert any(line.startswith("tag trainpipe.promoted_by:") and line.endswith("dag") for line in lines)


def test_registry_commands_refuse_with_the_fix(hook, model_name, train_and_register):
    missing = _trainpipe("rollback", model_name)
    assert missing.returncode == 1
    assert f"trainpipe rollback: no registered model '{model_name}' in this tracking store" in missing.stderr

    train_and_register("manual__1")
    registry.promote(hook.client, model_name, 1, actor="dag", reason="gates passed")
    nothing_before = _trainpipe("rollback", model_name)
    unknown = _trainpipe("promote", model_name, "9")

    assert nothing_before.returncode == 1
    assert nothing_before.stderr.strip() == (
        f"trainpipe rollback: {model_name} has no 'previous_champion' version to roll back to; promote a version "
        f"with `trainpipe promote {model_name} VERSION`")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == f"trainpipe promote: {model_name} has no version 9; its versions are 1"
    assert _aliases(hook, model_name) == {"champion": 1, "challenger": 1}
