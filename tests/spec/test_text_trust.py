"""Text columns and the text_bag family at the trust boundary. A column name is data: a Jinja template or a path
as a text feature's name reaches the plan and the trainer config as written, and nothing renders, reads or opens
it. A foreign value in a text option or in text_bag's params, and a text column under the mlp, are refused at their
own line, and the spec compiles to nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import REPO, record_secret_reads
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings

PASSWORD = "pw-52d4-never-shown"
SECRET = "secret-52d4-never-shown"
TEMPLATE = "{{ var.value.secret }}"
CONN_TEMPLATE = "{{ conn.leak.password }}"
PATH = "../../etc/passwd"


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A variable and a connection a rendered template would read; any read is recorded."""
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    return record_secret_reads(monkeypatch, secret=SECRET, password=PASSWORD)


def _text(column: str = "review", transform: dict | None = None, model: dict | None = None) -> str:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["training"]["features"].append(column)
    spec["training"]["transforms"][column] = {"type": "text"} if transform is None else transform
    spec["training"]["model"] = {"type": "text_bag"} if model is None else model
    return yaml.safe_dump(spec, sort_keys=False, width=1000)


def _compile(tmp_path: Path, text: str):
    file = tmp_path / "reviews.yaml"
    file.write_text(text)
    return compile_file(file, "reviews.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def _refused(tmp_path: Path, text: str) -> list[tuple[str, int, str]]:
    """(field path, line, message) of each problem; the spec compiled to nothing."""
    with pytest.raises(SpecError) as raised:
        _compile(tmp_path, text)
    return [(p.field_path, p.line, p.message) for p in raised.value.problems]


def _line(text: str, written: str, after: str = "") -> int:
    """The 1-based line where ``written`` is first written (after the first line holding ``after``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines) if i >= start and line.strip().startswith(written)) + 1


@pytest.mark.parametrize("column", [TEMPLATE, CONN_TEMPLATE, PATH, "{% include '/etc/passwd' %}"])
def test_a_text_column_named_like_a_template_or_a_path_stays_literal(tmp_path, _secrets, column):
    plan = _compile(tmp_path, _text(column))

    config = plan.trainer.to_json()
    written = json.loads(config)
    assert written["features"][-1] == column
    assert written["transforms"][-1]["feature"] == column and written["transforms"][-1]["type"] == "text"
    assert plan.validation.text_features == plan.evaluation.text_features == (column,)
    assert column in plan.validation.required_columns
    shown = json.dumps(plan.to_dict(), default=str)
    assert SECRET not in config + shown and PASSWORD not in config + shown
    assert "root:" not in config + shown  # /etc/passwd was not opened
    assert _secrets == []  # no variable or connection was read


@pytest.mark.parametrize(("key", "value", "message"), [
    ("max_tokens", TEMPLATE, "Input should be a valid integer"),
    ("max_tokens", PATH, "Input should be a valid integer"),
    ("max_tokens", 4097, "less than or equal to 4096"),
    ("max_tokens", 0, "greater than or equal to 1"),
    ("ngrams", 3, "Input should be 1 or 2"),
    ("ngrams", TEMPLATE, "Input should be 1 or 2"),
    ("hash_buckets", 2**24, "at most 16,777,214 for text"),
    ("hash_buckets", TEMPLATE, "Input should be a valid integer"),
])
def test_a_foreign_text_option_is_refused_at_its_line(tmp_path, _secrets, key, value, message):
    text = _text(transform={"type": "text", key: value})

    [(path, line, problem)] = _refused(tmp_path, text)

    assert path == f"training.transforms.review.{key}"
    assert line == _line(text, f"{key}:", after="transforms:")
    assert message in problem
    assert SECRET not in problem and PASSWORD not in problem and _secrets == []


@pytest.mark.parametrize(("params", "at", "written", "message"), [
    # A template where a number goes: refused, quoted as written (never rendered).
    ({"embedding_dim": TEMPLATE}, "embedding_dim", "embedding_dim:", f"a whole number from 1 to 1024, got {TEMPLATE!r}"),
    ({"hidden_layers": PATH}, "hidden_layers", "hidden_layers:", "a list of at most 8 widths"),
    # A list item: at its own line.
    ({"hidden_layers": [16, TEMPLATE]}, "hidden_layers[1]", f"- '{TEMPLATE}'", "a width from 1 to 16384"),
    ({"dropout": CONN_TEMPLATE}, "dropout", "dropout:", "a fraction in [0, 1)"),
    # A key text_bag does not take (weights to load, a module to import): refused, never opened or imported.
    ({"weights": PATH}, "weights", "weights:", "not a text_bag parameter; the parameters are embedding_dim, "
                                               "hidden_layers, dropout"),
    ({"module": "os:system"}, "module", "module:", "not a text_bag parameter"),
])
def test_foreign_text_bag_params_are_refused_at_their_line(tmp_path, _secrets, params, at, written, message):
    text = _text(model={"type": "text_bag", "params": params})

    [(path, line, problem)] = _refused(tmp_path, text)

    assert path == f"training.model.params.{at}"
    assert line == _line(text, written, after="params:")
    assert message in problem
    assert SECRET not in problem and PASSWORD not in problem and "root:" not in problem
    assert _secrets == []


def test_a_text_column_under_the_mlp_is_refused_at_its_type_line(tmp_path, _secrets):
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["training"]["features"].append(TEMPLATE)
    spec["training"]["transforms"][TEMPLATE] = {"type": "text"}  # the model stays the example's mlp
    text = yaml.safe_dump(spec, sort_keys=False, width=1000)

    [(path, line, problem)] = _refused(tmp_path, text)

    assert path == f"training.transforms.{TEMPLATE}.type"
    assert line == _line(text, "type: text", after=TEMPLATE)
    assert problem.startswith(f"{TEMPLATE!r} is text") and "set training.model.type: text_bag" in problem
    assert _secrets == []
