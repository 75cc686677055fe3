"""Sharded DAG files (ADR 0012): every spec compiled by exactly one file of ``dags/``, a stable
assignment, broken specs still their own import errors, task runs still one spec."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.probes import probe
from tests.support import REPO, dag_bag
from trainpipe.compile.spec_files import list_specs
from trainpipe.dags.files import SHARD_FILES, SINGLE_FILE_MAX, shard_count, shard_of
from trainpipe.errors import DagFileError
from trainpipe.settings import Settings

EXAMPLE = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
# More than SINGLE_FILE_MAX: the folder is sharded.
SPEC_COUNT = SINGLE_FILE_MAX + 40


def _spec(pipeline_id: str) -> str:
    return EXAMPLE.replace("pipeline_id: fraud_detector", f"pipeline_id: {pipeline_id}")


def _sharded_folder(tmp_path: Path) -> tuple[Path, Path]:
    """SPEC_COUNT specs in ``dag_configs/`` (a sharded folder) and an empty ``dags/``."""
    configs = tmp_path / "dag_configs"
    configs.mkdir()
    for i in range(SPEC_COUNT):
        (configs / f"p{i:04d}.yaml").write_text(_spec(f"p{i:04d}"))
    dags = tmp_path / "dags"
    dags.mkdir()
    return configs, dags


def _shard_file(shard: int) -> Path:
    return REPO / "dags" / ("trainpipe_dags.py" if shard == 0 else f"shards/trainpipe_dags_{shard:02d}.py")


def _assignment(root: Path) -> dict[str, int]:
    specs = list_specs(root)
    count = shard_count(len(specs))
    return {relative: shard_of(relative, count) for relative, _ in specs}


def test_dags_shows_one_file_and_keeps_one_file_per_shard_out_of_the_way_each_calling_its_own_shard():
    assert sorted(p.name for p in (REPO / "dags").iterdir()) == ["shards", "trainpipe_dags.py"]
    files = sorted(p.relative_to(REPO / "dags") for p in (REPO / "dags").rglob("*.py"))
    assert files == sorted(_shard_file(shard).relative_to(REPO / "dags") for shard in range(SHARD_FILES))
    assert "load_dags(globals(), shards=64)\n" in _shard_file(0).read_text()
    for shard in range(SHARD_FILES):
        text = _shard_file(shard).read_text()
        assert "from trainpipe import load_dags\n" in text
        if shard:
            assert text.endswith(f"\nload_dags(globals(), shards={SHARD_FILES}, shard={shard})\n")
        # Airflow's safe mode parses only files that mention both.
        assert "airflow" in text.lower() and "dag" in text.lower()


def test_list_specs_selects_and_orders_as_the_folder_walk_always_did(tmp_path: Path):
    for name in ("a.yaml", "a-b.yaml", "a/b.yaml", "a/c/d.yml", "_defaults.yaml", "a/_draft.yaml", "notes.txt",
                 ".hidden/x.yaml", "z.YAML"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x: 1\n")
    (tmp_path / "folder.yaml").mkdir()  # reported by the compiler as "not a regular file", not skipped
    (tmp_path / "linked").symlink_to(tmp_path / "a", target_is_directory=True)  # not followed

    walked = sorted(p for p in [*tmp_path.rglob("*.yaml"), *tmp_path.rglob("*.yml")] if not p.name.startswith("_"))

    assert [Path(path) for _, path in list_specs(tmp_path)] == walked
    assert [relative for relative, _ in list_specs(tmp_path)] == [
        ".hidden/x.yaml", "a/b.yaml", "a/c/d.yml", "a-b.yaml", "a.yaml", "folder.yaml"]
    assert list_specs(tmp_path / "missing") == []


def test_a_small_folder_is_compiled_by_shard_zero_alone(tmp_path: Path):
    for i in range(SINGLE_FILE_MAX):
        (tmp_path / f"p{i:04d}.yaml").write_text("")
    assert set(_assignment(tmp_path).values()) == {0}

    (tmp_path / "one_more.yaml").write_text("")
    shards = _assignment(tmp_path)
    assert len(set(shards.values())) > SHARD_FILES // 2  # the files share the folder
    sizes = [list(shards.values()).count(shard) for shard in range(SHARD_FILES)]
    assert max(sizes) <= 3 * len(shards) / SHARD_FILES


def test_adding_or_removing_a_spec_moves_no_other_spec(tmp_path: Path):
    for i in range(SPEC_COUNT):
        (tmp_path / f"team{i % 7}").mkdir(exist_ok=True)
        (tmp_path / f"team{i % 7}" / f"p{i:04d}.yaml").write_text("")
    before = _assignment(tmp_path)

    (tmp_path / "team3" / "added.yaml").write_text("")
    after_adding = _assignment(tmp_path)
    (tmp_path / "team1" / "p0001.yaml").unlink()
    after_removing = _assignment(tmp_path)

    assert {k: v for k, v in after_adding.items() if k != "team3/added.yaml"} == before
    assert after_removing == {k: v for k, v in after_adding.items() if k != "team1/p0001.yaml"}


@pytest.fixture(scope="module")
def sharded_configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configs = tmp_path_factory.mktemp("sharded") / "dag_configs"
    configs.mkdir()
    for i in range(SPEC_COUNT):
        (configs / f"p{i:04d}.yaml").write_text(_spec(f"p{i:04d}"))
    return configs


def _other_shard_name(configs: Path, than: str, count: int) -> str:
    """A file name (sorting after ``than``) whose shard differs from ``than``'s."""
    return next(name for i in range(100) if shard_of(name := f"zz_copy{i}.yaml", count) != shard_of(than, count))


@pytest.mark.integration
def test_a_sharded_folder_loads_each_dag_once_with_broken_specs_as_their_own_errors(
        sharded_configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db):
    configs = sharded_configs
    broken = _spec("broken_one").replace("  epochs: 8", "  epochs: 0")
    (configs / "broken_one.yaml").write_text(broken)
    count = shard_count(len(list_specs(configs)) + 1)
    # A copy that forgot to rename its pipeline id, in another shard than the original.
    duplicate = _other_shard_name(configs, "p0000.yaml", count)
    (configs / duplicate).write_text(_spec("p0000"))
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    shards = _assignment(configs)
    assert len(set(shards.values())) > SHARD_FILES // 2

    bag = dag_bag()

    # The id declared twice loads from neither file, whatever their path order (ADR 0014).
    expected = {f"p{i:04d}" for i in range(1, SPEC_COUNT)}
    assert set(bag.dag_ids) == expected and len(bag.dag_ids) == SPEC_COUNT - 1  # each exactly once
    for dag_id in expected:
        assert bag.get_dag(dag_id).fileloc == str(_shard_file(shards[f"{dag_id}.yaml"]))
    broken_path, duplicate_path, original_path = (str((configs / name).resolve())
                                                  for name in ("broken_one.yaml", duplicate, "p0000.yaml"))
    assert sorted(bag.import_errors) == sorted([broken_path, duplicate_path, original_path])
    assert bag.import_errors[broken_path].startswith("dag_configs/broken_one.yaml:")
    assert "training.epochs:" in bag.import_errors[broken_path]
    line = _spec("p0000").splitlines().index("pipeline_id: p0000") + 1
    for path, other in ((duplicate_path, "p0000.yaml"), (original_path, duplicate)):
        mine = Path(path).name
        assert bag.import_errors[path] == (
            f"dag_configs/{mine}:{line}:1: pipeline_id: 'p0000' is also declared in dag_configs/{other}; pipeline "
            "ids must be unique and no file wins by its path, so neither DAG is loaded: rename one")

    # N -> N+1: the new spec lands in its shard, every other DAG stays in its file (the cache is warm now).
    (configs / "zz_new.yaml").write_text(_spec("zz_new"))
    again = dag_bag()

    assert set(again.dag_ids) == expected | {"zz_new"}
    assert {d: again.get_dag(d).fileloc for d in expected} == {d: bag.get_dag(d).fileloc for d in expected}
    assert again.get_dag("zz_new").fileloc == str(_shard_file(shard_of("zz_new.yaml", count)))
    assert sorted(again.import_errors) == sorted([broken_path, duplicate_path, original_path])


def test_a_task_run_compiles_only_its_spec_even_from_another_shards_file(sharded_configs: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    from trainpipe import load_dags

    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(sharded_configs))
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "p0042")
    count = shard_count(len(list_specs(sharded_configs)))
    own = shard_of("p0042.yaml", count)

    from trainpipe.dags import files as dag_files

    monkeypatch.setattr(dag_files, "_REGISTERED_FOR_CONTEXT", {})
    in_its_shard: dict = {"__file__": str(_shard_file(own))}
    load_dags(in_its_shard, shards=SHARD_FILES, shard=own)
    # In the same process (`airflow dags test` parses the whole folder under the context) no other DAG
    # file registers the id again: Airflow would log a duplicate-id error for it.
    again: dict = {"__file__": str(_shard_file((own + 1) % SHARD_FILES))}
    load_dags(again, shards=SHARD_FILES, shard=(own + 1) % SHARD_FILES)
    # A worker (its own process) parsing a file that no longer holds the spec (the folder crossed
    # SINGLE_FILE_MAX since the DAG was listed) still finds it.
    monkeypatch.setattr(dag_files, "_REGISTERED_FOR_CONTEXT", {})
    elsewhere: dict = {"__file__": str(_shard_file((own + 1) % SHARD_FILES))}
    load_dags(elsewhere, shards=SHARD_FILES, shard=(own + 1) % SHARD_FILES)

    assert [k for k in in_its_shard if not k.startswith("__")] == ["p0042"]
    assert [k for k in again if not k.startswith("__")] == []
    assert [k for k in elsewhere if not k.startswith("__")] == ["p0042"]
    # A task run's parse leaves the cache as it is: it compiled one spec, not its shard.
    assert not (tmp_path / "home" / "cache").exists()


def test_a_shard_with_nothing_to_compile_does_not_import_the_compiler(tmp_path: Path):
    configs = tmp_path / "dag_configs"
    configs.mkdir()
    (configs / "only.yaml").write_text(_spec("only"))
    code = (f"import sys; from trainpipe import load_dags; namespace = {{'__file__': {str(_shard_file(5))!r}}}; "
            "load_dags(namespace, shards=64, shard=5); "
            "print(sorted(k for k in namespace if not k.startswith('__')), 'trainpipe.compile.compiler' in sys.modules)")
    env = {**os.environ, "TRAINPIPE_DAG_CONFIGS": str(configs), "TRAINPIPE_HOME": str(tmp_path / "home")}
    env.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)

    out = probe(code, env=env, check=True)

    assert out.stdout.strip() == "[] False"


def test_a_dag_file_finds_the_nearest_dag_configs_folder_or_says_how_to_name_one(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    from trainpipe.dags.files import specs_folder_for

    monkeypatch.delenv("TRAINPIPE_DAG_CONFIGS", raising=False)
    (tmp_path / "home" / "dags" / "shards").mkdir(parents=True)
    main, shard = tmp_path / "home" / "dags" / "trainpipe_dags.py", tmp_path / "home" / "dags" / "shards" / "t.py"
    with pytest.raises(DagFileError, match=r"found no dag_configs/ folder beside the DAG file .* set TRAINPIPE_DAG_CONFIGS"):
        specs_folder_for(str(main), None, settings=Settings.from_env())

    (tmp_path / "home" / "dag_configs").mkdir()
    # The main file and the shard files below it find the same folder.
    assert (specs_folder_for(str(main), None, settings=Settings.from_env())
            == specs_folder_for(str(shard), None, settings=Settings.from_env()) == tmp_path / "home" / "dag_configs")
    assert specs_folder_for(str(main), "../teams", settings=Settings.from_env()) == tmp_path / "home" / "dags" / ".." / "teams"
    assert specs_folder_for(str(main), tmp_path / "abs", settings=Settings.from_env()) == tmp_path / "abs"
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(tmp_path / "configured"))
    assert specs_folder_for(str(main), None, settings=Settings.from_env()) == tmp_path / "configured"
    # the DAG file's own choice wins
    assert specs_folder_for(str(main), "specs", settings=Settings.from_env()) == tmp_path / "home" / "dags" / "specs"


@pytest.mark.parametrize(("arguments", "message"), [
    ({"shards": 0}, r"shards must be a whole number >= 1 .* got 0; use shards=64 for a large folder"),
    ({"shards": True}, r"shards must be a whole number >= 1 .* got True"),
    ({"shards": 64, "shard": 64}, r"shard must be this file's number, 0 to 63 with shards=64, got 64"),
    ({"shard": 1}, r"shard must be this file's number, 0 to 0 with shards=1, got 1"),
])
def test_a_wrong_sharding_argument_is_named_with_its_fix_before_anything_is_compiled(arguments: dict, message: str):
    from trainpipe import load_dags

    namespace: dict = {"__file__": str(_shard_file(0))}
    with pytest.raises(DagFileError, match=message):
        load_dags(namespace, **arguments)
    assert list(namespace) == ["__file__"]


@pytest.mark.integration
def test_importing_trainpipe_for_load_dags_imports_neither_the_compiler_nor_airflow():
    code = ("import sys; from trainpipe import load_dags; "
            "print(sorted(m for m in ('trainpipe.compile.compiler', 'trainpipe.dags.files', 'airflow', 'pydantic', 'yaml') "
            "if m in sys.modules))")
    out = probe(code, check=True)
    assert out.stdout.strip() == "[]"


def test_a_parse_marks_modified_the_dag_files_of_the_shards_whose_specs_changed_and_only_those(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from trainpipe import load_dags

    configs, dags = _sharded_folder(tmp_path)
    files = {shard: dags / f"dags_{shard:02d}.py" for shard in range(SHARD_FILES)}
    for shard, path in files.items():
        path.write_text(f"from trainpipe import load_dags\n\nload_dags(globals(), shards={SHARD_FILES}, shard={shard})\n")
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)

    def parse(shard: int) -> dict:
        namespace = {"__file__": str(files[shard])}
        load_dags(namespace, shards=SHARD_FILES, shard=shard)
        return namespace

    for shard in files:  # the first parse of every file: each records itself, nothing is marked
        parse(shard)
    old = 1_000_000_000
    for path in files.values():
        os.utime(path, (old, old))
    count = shard_count(SPEC_COUNT + 1)
    edited, removed = "p0001.yaml", "p0002.yaml"
    added = next(name for i in range(1000) if shard_of(name := f"new{i}.yaml", count)
                 not in {shard_of(edited, count), shard_of(removed, count)})
    (configs / edited).write_text(_spec("p0001").replace("  epochs: 8", "  epochs: 9"))
    (configs / removed).unlink()
    (configs / added).write_text(_spec("added"))
    changed = {shard_of(name, count) for name in (edited, removed, added)}
    reader = next(shard for shard in range(SHARD_FILES) if shard not in changed)
    texts = {shard: path.read_text() for shard, path in files.items()}

    assert "added" not in parse(reader)

    touched = {shard for shard, path in files.items() if path.stat().st_mtime > old}
    assert touched == changed
    assert {shard: path.read_text() for shard, path in files.items()} == texts  # only their time stamps
    # Each marked file then compiles its change; a later parse marks nothing again.
    assert "added" in parse(shard_of(added, count))
    assert parse(shard_of(edited, count))["p0001"].params["epochs"] == 9
    for path in files.values():
        os.utime(path, (old, old))
    parse(reader)
    assert all(path.stat().st_mtime == old for path in files.values())


def test_the_dag_processors_watcher_marks_modified_the_files_of_changed_specs_and_all_of_them_for_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from trainpipe import load_dags
    from trainpipe.dags.files import watch_specs

    configs = tmp_path / "dag_configs"
    (configs / "team").mkdir(parents=True)
    for i in range(SPEC_COUNT):
        (configs / "team" / f"p{i:04d}.yaml").write_text(_spec(f"p{i:04d}"))
    dags = tmp_path / "dags"
    dags.mkdir()
    files = {shard: dags / f"dags_{shard:02d}.py" for shard in range(SHARD_FILES)}
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(dags))
    # Airflow marks a deleted spec's DAG stale only at a parse this long after the last that had it.
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD", "3")
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    for shard, path in files.items():
        path.write_text("")
        load_dags({"__file__": str(path)}, shards=SHARD_FILES, shard=shard)
    old = 1_000_000_000

    def marked_after(change, within: float = 60) -> set[int]:
        for path in files.values():
            os.utime(path, (old, old))
        change()
        deadline = time.monotonic() + within  # a no-hang bound: the watcher looks every 0.05 s
        while time.monotonic() < deadline:
            marked = {shard for shard, path in files.items() if path.stat().st_mtime > old}
            if marked:
                time.sleep(0.3)  # every mark of one look
                return {shard for shard, path in files.items() if path.stat().st_mtime > old}
            time.sleep(0.05)
        return set()

    stop = threading.Event()
    watcher = threading.Thread(target=watch_specs, args=(stop, 0.05, Settings.from_env()), daemon=True)
    watcher.start()
    try:
        _probe_until_seen(configs / "team" / "p0005.yaml", lambda change: marked_after(change, within=2))
        count = shard_count(SPEC_COUNT + 1)
        assert marked_after(lambda: (configs / "team" / "new.yaml").write_text(_spec("new"))) == {
            shard_of("team/new.yaml", count)}
        assert marked_after(lambda: (configs / "team" / "p0003.yaml").unlink()) == {shard_of("team/p0003.yaml", count)}
        # ... and once more after the threshold, so that the parse then finds the DAG gone and stale.
        assert marked_after(lambda: None) == {shard_of("team/p0003.yaml", count)}
        # A defaults file changes every spec under it: every DAG file is marked.
        assert marked_after(lambda: (configs / "team" / "_defaults.yaml").write_text("owner: team\n")) == set(files)
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert not watcher.is_alive()


@pytest.fixture
def watched_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path) -> tuple[Path, Path]:
    """A sharded configs folder and an empty DAG folder that is the dag-processor's bundle; no pending
    reparse request. (configs, dags)"""
    import json

    from airflow.models.dagbag import DagPriorityParsingRequest
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    configs, dags = _sharded_folder(tmp_path)
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(dags))
    # The DAG files' bundle (Airflow's default, whose path airflow.settings read at import).
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([{
        "name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(dags)}}]))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    with create_session() as session:
        session.execute(delete(DagPriorityParsingRequest))
    return configs, dags


def _parse_shard(dags: Path, shard: int) -> dict:
    from trainpipe import load_dags

    path = dags / f"dags_{shard:02d}.py"
    if not path.exists():
        path.write_text("")
    load_dags(namespace := {"__file__": str(path)}, shards=SHARD_FILES, shard=shard)
    return namespace


def _take_requests() -> set[str]:
    """What the dag-processor's loop does each second: take the pending reparse requests, deleting each
    row it read (as Airflow's manager does; a bulk delete would also drop a row written meanwhile)."""
    from airflow.models.dagbag import DagPriorityParsingRequest
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        requests = list(session.scalars(select(DagPriorityParsingRequest)))
        for request in requests:
            session.delete(request)
        return {request.relative_fileloc for request in requests}


def _replace(path: Path, text: str) -> None:
    """One change a look cannot see half-done (``write_text`` truncates, then writes: two changes)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _probe_until_seen(probe: Path, seen_after: Callable[[Callable[[], None]], object]) -> None:
    """Return once the watcher has surely made its first look: under load it can come late, and a change
    made before it is its baseline, not a change. ``probe`` (a spec) is rewritten until ``seen_after``
    the rewrite says the watcher acted on it."""
    deadline = time.monotonic() + 120  # a no-hang bound
    for attempt in itertools.count():
        text = _spec(probe.stem) + f"# probe {attempt}\n"
        if seen_after(lambda text=text: _replace(probe, text)):
            return
        assert time.monotonic() < deadline, "the watcher never looked at the folder"


def _requested_within(seconds: float) -> set[str]:
    deadline = time.monotonic() + seconds  # a no-hang bound
    while time.monotonic() < deadline:
        if found := _take_requests():
            return found
        time.sleep(0.05)
    return set()


@contextmanager
def _watching(configs: Path, dags: Path, every: float, busy: set[int]) -> Iterator[None]:
    """The watcher running with ``every``, entered once it has made its first look (``_probe_until_seen``
    with a spec of a shard not in ``busy``, parsed first: the watcher asks only for DAG files it knows)."""
    from trainpipe.dags.files import watch_specs

    count = shard_count(SPEC_COUNT)
    probe = next(f"p{i:04d}" for i in range(SPEC_COUNT) if shard_of(f"p{i:04d}.yaml", count) not in busy)
    probe_shard = shard_of(f"{probe}.yaml", count)
    probe_file = f"dags_{probe_shard:02d}.py"
    _parse_shard(dags, probe_shard)
    _take_requests()
    stop = threading.Event()
    watcher = threading.Thread(target=watch_specs, args=(stop, every, Settings.from_env()), daemon=True)
    watcher.start()
    def asked_after(change: Callable[[], None]) -> bool:
        change()
        return _requested_within(2 * every + 1) == {probe_file}

    try:
        _probe_until_seen(configs / f"{probe}.yaml", asked_after)
        yield
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert not watcher.is_alive()


def test_a_change_made_while_its_file_was_being_parsed_gets_that_file_parsed_again(watched_folder: tuple[Path, Path]):
    """The edit that lagged at 20,000 specs: a spec changed while its DAG file's parse was under way is
    not in that parse, and the dag-processor drops a request for a file it is parsing. The watcher asks
    for the file again when such a parse ends, through Airflow's reparse requests, until a parse that
    began after the change has run; then it asks for nothing more."""
    from trainpipe.compile.plan_cache import PlanCache

    configs, dags = watched_folder
    edited = "p0003.yaml"
    shard = shard_of(edited, shard_count(SPEC_COUNT))
    asked_for = f"dags_{shard:02d}.py"
    _parse_shard(dags, shard)  # it records itself
    with _watching(configs, dags, 0.05, busy={shard}):
        began = time.time()  # a parse of the shard's file begins: it lists the folder before the edit
        _replace(configs / edited, _spec("p0003").replace("  epochs: 8", "  epochs: 9"))
        assert _requested_within(60) == {asked_for}
        assert _requested_within(0.5) == set()  # asked once while it waits
        # The parse begun before the edit ends (the request was dropped: the file was being parsed).
        PlanCache(configs.resolve(), "watch", home=Settings.from_env().home).record_parse(shard, began, time.time())
        assert _requested_within(60) == {asked_for}
        # A parse begun after the edit serves it: nothing more is asked for.
        assert _parse_shard(dags, shard)["p0003"].params["epochs"] == 9
        assert _requested_within(1.0) == set()


def test_the_watcher_asks_for_a_change_that_another_shards_parse_saw_first(watched_folder: tuple[Path, Path]):
    """Every shard's parse lists the whole folder and updates the index the shards share; the watcher
    compares with its own last look, so a parse that saw the change first does not hide it."""
    configs, dags = watched_folder
    count = shard_count(SPEC_COUNT)
    edited = "p0003.yaml"
    shard = shard_of(edited, count)
    other = next(s for s in range(SHARD_FILES) if s != shard and any(
        shard_of(f"p{i:04d}.yaml", count) == s for i in range(SPEC_COUNT)))
    for number in (shard, other):
        _parse_shard(dags, number)
    # Just after a look (the probe's) the watcher sleeps 5 s: the other shard's parse sees the edit first.
    with _watching(configs, dags, 5.0, busy={shard, other}):
        _replace(configs / edited, _spec("p0003").replace("  epochs: 8", "  epochs: 9"))
        _parse_shard(dags, other)
        assert _requested_within(60) == {f"dags_{shard:02d}.py"}


def test_a_loop_of_asset_schedules_across_shards_is_refused_in_each_and_recovers_when_broken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A on B's model and B on A's snapshot, their files in two shards: once each shard has parsed, both
    are refused, each in its own shard with the other named, and a shard whose loop partner changed is
    marked for an early parse. Broken (B on cron), both load again; a deleted partner's record is not
    held against the spec left behind."""
    from trainpipe import load_dags

    configs, dags = _sharded_folder(tmp_path)
    count = shard_count(SPEC_COUNT + 2)
    name_a = "loop_a.yaml"
    name_b = next(name for i in range(100) if shard_of(name := f"loop_b{i}.yaml", count) != shard_of(name_a, count))
    shard_a, shard_b = shard_of(name_a, count), shard_of(name_b, count)
    (configs / name_a).write_text(_spec("loop_a").replace(
        'schedule: "@daily"', "schedule:\n  assets: [trainpipe://loop_b/model]"))
    (configs / name_b).write_text(_spec("loop_b").replace(
        'schedule: "@daily"', "schedule:\n  assets: [trainpipe://loop_a/snapshot]"))
    files = {shard: dags / f"dags_{shard:02d}.py" for shard in (shard_a, shard_b)}
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    errors: list[dict] = []
    monkeypatch.setattr("trainpipe.dags.airflow_compat.report_spec_errors", lambda reported, **_: errors.append(reported))

    def parse(shard: int) -> tuple[dict, dict[str, str]]:
        errors.clear()
        namespace = {"__file__": str(files[shard])}
        load_dags(namespace, shards=SHARD_FILES, shard=shard)
        return namespace, {path.name: str(error) for reported in errors for path, error in reported.items()}

    for path in files.values():
        path.write_text("")
    first, _ = parse(shard_a)  # B's shard has kept nothing yet
    assert "loop_a" in first
    old = 1_000_000_000
    os.utime(files[shard_a], (old, old))

    namespace_b, errors_b = parse(shard_b)

    assert "loop_b" not in namespace_b
    assert errors_b[name_b].startswith(f"dag_configs/{name_b}:")
    assert ("'trainpipe://loop_a/snapshot' is updated by pipeline 'loop_a', and these pipelines start each other "
            f"without end: loop_a (dag_configs/{name_a}), loop_b (dag_configs/{name_b})") in errors_b[name_b]
    assert files[shard_a].stat().st_mtime > old  # A's shard is asked to judge its spec again, first
    namespace_a, errors_a = parse(shard_a)
    assert "loop_a" not in namespace_a and "start each other without end" in errors_a[name_a]
    assert parse(shard_a)[0].keys() == namespace_a.keys()  # stable: no file wins by parse order

    (configs / name_b).write_text(_spec("loop_b"))  # on cron again
    assert "loop_b" in parse(shard_b)[0]
    assert "loop_a" in parse(shard_a)[0]

    (configs / name_b).write_text(_spec("loop_b").replace(
        'schedule: "@daily"', "schedule:\n  assets: [trainpipe://loop_a/snapshot]"))
    assert "loop_b" not in parse(shard_b)[0] and "loop_a" not in parse(shard_a)[0]
    (configs / name_b).unlink()  # its shard keeps B's record until it parses again
    assert "loop_a" in parse(shard_a)[0]
