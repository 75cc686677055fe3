"""The spec folder is an input boundary: whatever a file holds, loading it costs a small, bounded
time and memory and ends in a located error (ADR 0004). The limits are the loader's MAX_SPEC_*."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest

from tests.probes import probe
from tests.support import REPO, spec_with
from trainpipe.commands.main import main
from trainpipe.compile import compiler as factory
from trainpipe.compile.compiler import compile_directory
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe.spec.loader import MAX_SPEC_BYTES, MAX_SPEC_DEPTH, MAX_SPEC_NODES, load_yaml_text, read_spec_text

FIXTURES = REPO / "tests" / "fixtures" / "bad_specs"
EXAMPLE = REPO / "dag_configs" / "fraud_detector.yaml"


def test_the_documented_limits():
    # docs/specs.md and ADR 0004 state these numbers.
    assert (MAX_SPEC_BYTES, MAX_SPEC_NODES, MAX_SPEC_DEPTH) == (1_048_576, 10_000, 32)


def test_empty_file_is_located_at_1_1(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert (FIXTURES / "standalone" / "empty.yaml").stat().st_size == 0

    assert main(["validate", "tests/fixtures/bad_specs/standalone/empty.yaml"]) == 1

    assert capsys.readouterr().out.splitlines()[0] == (
        "tests/fixtures/bad_specs/standalone/empty.yaml:1:1: "
        "a spec is a YAML mapping with pipeline_id, data, training, ...; found an empty file")


def test_alias_bomb_is_refused_fast_with_little_memory(capsys, monkeypatch):
    """9 levels of 9 aliases stand for 387 million nodes; before the limits, validating this file
    took minutes and gigabytes. A generous bound: it takes milliseconds."""
    monkeypatch.chdir(REPO)
    main(["validate", str(EXAMPLE)])  # imports done outside the measurement
    capsys.readouterr()
    tracemalloc.start()
    try:
        start, start_cpu = time.perf_counter(), time.process_time()
        code = main(["validate", "tests/fixtures/bad_specs/alias_bomb.yaml"])
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert code == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "tests/fixtures/bad_specs/alias_bomb.yaml:6:8: alias *d stands for 7,381 nodes and takes the file past the "
        "limit of 10,000 YAML nodes per spec (an alias counts as the nodes it stands for); aliases of aliases "
        'multiply ("billion laughs"): write the values out, or alias only small values')
    # The work is bounded in CPU time (milliseconds; the unbounded bomb took minutes); the wall-clock
    # bound is looser because a loaded CI machine may not schedule this process for a while.
    assert cpu < 2.0
    assert elapsed < 10.0
    assert peak < 50 * 2**20


@pytest.mark.integration
def test_validate_process_on_an_alias_bomb_needs_no_more_memory_than_on_a_good_spec():
    """Peak RSS of a whole `trainpipe validate` process (imports included), bomb against the example."""
    peak_probe = ("import resource, sys; from trainpipe.commands.main import main; code = main(['validate', sys.argv[1]]); "
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")

    def peak_kib(spec: Path) -> int:
        run = probe(peak_probe, str(spec))
        return int(run.stdout.splitlines()[-1])

    good, bomb = peak_kib(EXAMPLE), peak_kib(FIXTURES / "alias_bomb.yaml")
    assert bomb < good + 64 * 1024, (good, bomb)


def test_merge_keys_and_tagged_collections_count_their_aliases_too():
    """PyYAML builds merge keys and tagged collections itself, sharing aliased values; they are
    counted by the same walk, or pydantic would walk the shared values exponentially."""
    levels = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
        f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True))
    for last in ("i: {<<: {x: *h}}\n", "i: !!omap [x: *h, y: *h]\n", "i: !!set {? *h}\n"):
        with pytest.raises(SpecError, match=r"^x.yaml:5:8: alias \*d stands for 7,381 nodes"):
            load_yaml_text(levels + last, "x.yaml")


def test_too_many_nodes_without_aliases_is_located_at_the_node_past_the_limit():
    text = "features: [" + ", ".join(["f"] * (MAX_SPEC_NODES + 5)) + "]\n"
    # Nodes in order: the root mapping, the key, the list, then its items (item k is node 4 + k, at column 12 + 3k).
    first_past = MAX_SPEC_NODES + 1 - 4
    with pytest.raises(SpecError) as raised:
        load_yaml_text(text, "x.yaml")
    assert str(raised.value) == (
        f"x.yaml:1:{12 + 3 * first_past}: the file goes past the limit of 10,000 YAML nodes per spec "
        "(an alias counts as the nodes it stands for); split it into smaller specs")


def test_within_the_limits_is_loaded():
    text = "features: [" + ", ".join(["f"] * (MAX_SPEC_NODES - 3)) + "]\n"
    assert len(load_yaml_text(text, "x.yaml").data["features"]) == MAX_SPEC_NODES - 3
    nested = "a: " + "[" * (MAX_SPEC_DEPTH - 1) + "]" * (MAX_SPEC_DEPTH - 1) + "\n"
    load_yaml_text(nested, "x.yaml")


@pytest.mark.parametrize("text, where", [
    ("[" * 100_000 + "]" * 100_000, "1:33: "),  # 200 KB: composing it overflowed libyaml's C stack (segfault)
    ("- " * 100_000 + "x\n", "1:65: "),  # the same depth as block sequences
    # Block mappings need two more bytes per level: composed, then refused by the builder's walk.
    ("a:\n" + "".join("  " * (depth + 1) + f"k{depth}:\n" for depth in range(40)), "33:65: a.k0.k1"),
])
def test_deep_nesting_is_refused_and_located_without_crashing(text, where):
    """Run in a child process: if the guard regressed, the crash must not take pytest down with it."""
    code = ("import sys; from trainpipe.spec.loader import load_yaml_text; from trainpipe.errors import SpecError\n"
            "try:\n    load_yaml_text(sys.stdin.read(), 'x.yaml')\nexcept SpecError as err:\n    print(err)")
    run = probe(code, input=text, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith(f"x.yaml:{where}"), run.stdout[:300]
    assert run.stdout.rstrip().endswith("nested more than 32 levels deep, the limit for a spec; flatten this part of the file")


def test_recursive_alias_is_located():
    for text in ("a: &a [*a]\n", "a: &a {<<: *a}\n"):
        with pytest.raises(SpecError, match=r"^x.yaml:1:4: found a recursive alias; write plain values$"):
            load_yaml_text(text, "x.yaml")


def test_oversized_file_is_refused_before_it_is_read(tmp_path):
    """A sparse 1 GiB file: reading it whole would take seconds and a gigabyte."""
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as handle:
        handle.truncate(2**30)
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as raised:
            read_spec_text(huge, "dag_configs/huge.yaml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(raised.value) == ("dag_configs/huge.yaml:1:1: the file is larger than 1,048,576 bytes, the limit for a "
                                 "spec (a spec is a few KB); split it into smaller specs")
    assert peak < 4 * MAX_SPEC_BYTES


def test_named_pipe_is_refused_instead_of_hanging_the_parse(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "good.yaml").write_text(EXAMPLE.read_text())
    os.mkfifo(configs / "pipe.yaml")  # nothing ever writes to it: a blocking open would wait forever

    result = compile_directory(configs, relative_to=tmp_path, settings=Settings.from_env())

    assert list(result.plans) == ["fraud_detector"]
    assert str(result.errors["configs/pipe.yaml"]) == (
        "configs/pipe.yaml:1:1: not a regular file (a folder, pipe or device); a spec is a plain text file: rename or move it")


def test_non_utf8_defaults_file_is_reported_at_its_own_line(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "_defaults.yaml").write_bytes(b"owner: ml-team\ndescription: r\xe9sum\xe9\n")
    (configs / "good.yaml").write_text(EXAMPLE.read_text())

    result = compile_directory(configs, relative_to=tmp_path, settings=Settings.from_env())

    assert result.plans == {}
    assert str(result.errors["configs/good.yaml"]) == (
        "configs/_defaults.yaml:2:15: the file is not UTF-8 (byte 0xe9 at offset 29, as an editor saving Latin-1 or "
        "Windows-1252 writes an accented letter); save the file as UTF-8")


def test_non_utf8_column_counts_characters_not_bytes(tmp_path):
    spec = tmp_path / "x.yaml"
    # Two UTF-8 letters of two bytes each before a Latin-1 byte on the same line.
    spec.write_bytes("pipeline_id: x\ndescription: ünïcode then ".encode() + b"\xe9\n")
    with pytest.raises(SpecError, match=r"^x.yaml:2:27: the file is not UTF-8 \(byte 0xe9 at offset 43,"):
        read_spec_text(spec, "x.yaml")


def test_unexpected_exception_in_one_spec_is_that_files_error(tmp_path, monkeypatch, caplog):
    """No input is known to raise anything but SpecError, so a failure is injected into the planning
    stage for one file; the folder's other specs must still compile, and the message must carry the
    exception's type and text but neither traceback nor a path of this machine."""
    configs = tmp_path / "configs"
    configs.mkdir()
    for spec in (REPO / "dag_configs").glob("*.yaml"):
        (configs / spec.name).write_text(spec.read_text())
    real_build_plan = factory.build_plan

    def build_plan(spec, **kwargs):
        if spec.pipeline_id == "search_ranker_nightly":
            raise RuntimeError(f"cannot plan {kwargs['spec_file']} under {configs}")
        return real_build_plan(spec, **kwargs)

    monkeypatch.setattr(factory, "build_plan", build_plan)
    result = compile_directory(configs, relative_to=tmp_path, settings=Settings.from_env())

    assert set(result.plans) == {"digit_classifier", "fraud_detector", "fraud_detector_approval",
                                 "fraud_detector_multinode", "fraud_detector_tuned", "search_ranker_gpu", "ticket_assistant",
                                 "ticket_intent", "ticket_router"}
    message = str(result.errors["configs/search_ranker_nightly.yaml"])
    assert message == (
        "configs/search_ranker_nightly.yaml:1:1: trainpipe could not compile this file (RuntimeError: cannot plan "
        "configs/search_ranker_nightly.yaml under configs); this is a trainpipe bug: please report it with the file "
        "(the traceback is in the log)")
    assert str(tmp_path) not in message
    assert "Traceback" in caplog.text and "cannot plan" in caplog.text  # operators get the traceback in the log


def test_unexpected_exception_in_a_lone_spec_is_a_located_error(monkeypatch, capsys):
    """`trainpipe validate/render/train FILE` print it like any other problem, not a traceback."""
    def build_plan(spec, **kwargs):
        raise KeyError("checkpoint")

    monkeypatch.setattr(factory, "build_plan", build_plan)
    monkeypatch.chdir(REPO)

    assert main(["validate", "dag_configs/fraud_detector.yaml"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "dag_configs/fraud_detector.yaml:1:1: trainpipe could not compile this file (KeyError: 'checkpoint'); "
        "this is a trainpipe bug: please report it with the file (the traceback is in the log)")


def test_a_large_defaults_file_costs_each_spec_linear_time(tmp_path):
    """Merging used to scan every position of the defaults once per key taken from them: quadratic,
    4.5 s of CPU per spec for a _defaults.yaml of 4,900 keys. A generous CPU-time bound."""
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "_defaults.yaml").write_text("".join(f"k{i}: {i}\n" for i in range(4_900)))
    for n in range(5):
        spec_with(configs, "pipeline_id: fraud_detector", f"pipeline_id: s{n}", name=f"s{n}.yaml")

    start = time.process_time()
    result = compile_directory(configs, relative_to=tmp_path, settings=Settings.from_env())
    cpu = time.process_time() - start

    assert result.plans == {}
    problems = result.errors["configs/s0.yaml"].problems
    assert len(problems) == 4_900
    assert str(problems[1]).startswith("configs/_defaults.yaml:2:1: k1: unknown key; ")  # located in the defaults
    assert cpu < 10, f"{cpu:.1f} s of CPU for 5 specs"
