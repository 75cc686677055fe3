"""The spec loader builds values itself while recording positions: it must return exactly what
``yaml.safe_load`` returns, and refuse what ``safe_load`` refuses."""

from __future__ import annotations

import pytest
import yaml

from trainpipe.errors import SpecError
from trainpipe.spec.loader import load_yaml_text

SAME_AS_SAFE_LOAD = {
    "strings": "a: plain\nb: 'single'\nc: \"double \\t\"\nd: |\n  block\n  text\ne: >\n  folded\n  text\n",
    "yaml 1.1 ints": "a: 12\nb: -3\nc: 0x1F\nd: 0o17\ne: 017\nf: 1_000\ng: 190:20:30\nh: +5\n",
    "floats": "a: 0.5\nb: 1e3\nc: 6.8523015e+5\nd: .inf\ne: -.inf\nf: 1_000.5\ng: 190:20:30.15\n",
    "nan": "a: .nan\n",
    "yaml 1.1 booleans": "a: yes\nb: No\nc: on\nd: OFF\ne: true\nf: False\n",
    "nulls": "a: ~\nb: null\nc:\nd: Null\n",
    "timestamps and dates": "a: 2025-01-01\nb: 2025-01-01T10:00:00Z\nc: 2001-12-14 21:59:43.10 -5\n",
    "quoted look-alikes stay strings": "a: '12'\nb: 'yes'\nc: '2025-01-01'\nd: '~'\n",
    "explicit tags": "a: !!str 12\nb: !!int '7'\nc: !!float '1'\nd: !!binary aGVsbG8=\ne: !!set {x, y}\n",
    "tagged collections": "a: !!omap [{x: 1}, {y: 2}]\nb: !!pairs [{x: 1}, {x: 2}]\nc: !!map {k: v}\nd: !!seq [1]\n",
    "anchors and aliases": "base: &b {lr: 0.1, layers: [1, 2]}\nother: *b\nlist: [&x 3, *x]\n",
    "merge keys": "base: &b {lr: 0.1, epochs: 2}\nrun:\n  <<: *b\n  epochs: 5\nmulti:\n  <<: [*b, {seed: 1}]\n",
    "nested flow and block": "a:\n  - {x: [1, {y: z}]}\n  - - deep\n    - [1, 2]\nb: {}\nc: []\n",
    "non-string keys": "1: one\n2.5: two\nfalse: three\n~: four\n2025-01-01: five\n",
    "scalar document": "just a string\n",
    "list document": "- 1\n- two\n",
    "empty document": "",
    "comments only": "# nothing here\n",
    "the example spec": None,
}


@pytest.mark.parametrize("name", SAME_AS_SAFE_LOAD)
def test_loader_returns_what_safe_load_returns(name):
    from pathlib import Path

    text = SAME_AS_SAFE_LOAD[name]
    if text is None:
        text = (Path(__file__).resolve().parents[2] / "dag_configs" / "fraud_detector.yaml").read_text()
    ours = load_yaml_text(text, "x.yaml").data
    theirs = yaml.safe_load(text)
    if name == "nan":
        assert ours["a"] != ours["a"] and theirs["a"] != theirs["a"]
    else:
        assert ours == theirs
        assert repr(ours) == repr(theirs)  # same types too (1 vs 1.0 vs True)


def test_positions_point_at_keys_and_items():
    loaded = load_yaml_text("a:\n  b: [x, y]\n  c:\n    - d: 1\n", "x.yaml")
    assert loaded.positions[("a", "b")] == (2, 3)
    assert loaded.positions[("a", "b", 1)] == (2, 10)
    assert loaded.positions[("a", "c", 0, "d")] == (4, 7)


def test_python_tags_are_refused_with_the_safe_load_rule():
    with pytest.raises(SpecError, match=r"x.yaml:1:4: could not determine a constructor .*language-specific tags"):
        load_yaml_text("a: !!python/object/apply:os.system ['true']\n", "x.yaml")


def test_recursive_alias_is_an_error_not_a_hang():
    with pytest.raises(SpecError, match="x.yaml:1:4: found a recursive alias"):
        load_yaml_text("a: &a [1, *a]\n", "x.yaml")


def test_unhashable_key_is_reported_with_its_line():
    with pytest.raises(SpecError, match="x.yaml:2:5: found unhashable key"):
        load_yaml_text("a:\n  ? [1, 2]\n  : v\n", "x.yaml")


def test_duplicate_keys_are_all_reported():
    with pytest.raises(SpecError) as caught:
        load_yaml_text("a: 1\nb: 2\na: 3\nb: 4\n", "x.yaml")
    assert [str(p) for p in caught.value.problems] == [
        "x.yaml:3:1: a: duplicate key; YAML would silently keep only the last one, remove one",
        "x.yaml:4:1: b: duplicate key; YAML would silently keep only the last one, remove one",
    ]


def test_memoised_tag_resolution_keeps_quoted_and_plain_apart():
    """The same text resolves to different types plain and quoted, whichever was seen first."""
    for _ in range(2):
        assert load_yaml_text("a: '12'\nb: 12\nc: 'yes'\nd: yes\ne: '~'\nf: ~\n", "x.yaml").data == {
            "a": "12", "b": 12, "c": "yes", "d": True, "e": "~", "f": None}
        assert load_yaml_text("b: 12\na: '12'\n", "x.yaml").data == {"b": 12, "a": "12"}
