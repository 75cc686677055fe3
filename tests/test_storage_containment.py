"""Relative URIs stay inside the storage root: refused by their text at the spec stage, and again by
``storage.resolve_uri`` before any storage is touched. Without a platform policy a local absolute path must
lie under the storage root too (the spec's compile and the snapshot refuse a worker's own files); s3:// URIs
are read through their connection."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainpipe import storage, uris
from trainpipe.errors import OutsideStorageRootError, SpecError, TrainpipeError
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

CLIMBING = ["..", "../x", "../../../../etc/passwd", "a/../../x", "a/b/../../../x", "./../x", "a//../../x", "a/./../.."]
INSIDE = ["x.parquet", "demo/transactions/transactions.parquet", "a/../x", "a/b/../../x", "./a/./b", "a/..", ".",
          "..a/x", "a../x", "a/.../x", "a/b/"]
ABSOLUTE = ["file:///etc/passwd", "s3://lake/../x", "/etc/passwd", "s3a://bucket/../../a", "file:///root/../../x"]

FIX = ("relative URIs are relative to the storage root and must stay inside it; for data outside it, use an s3:// URI, "
       "or a local path the platform's policy allows (data.uris)")

SPEC = """\
pipeline_id: p
data:
  uri: {uri}
training:
  task: binary_classification
  features: [amount]
  label: is_fraud
evaluation:
  metrics: [auc]
registration:
  model_name: m
"""


@pytest.mark.parametrize("uri", CLIMBING)
def test_climbing_relative_uris_are_recognised(uri: str):
    assert uris.climbs_out_of_root(uri)


@pytest.mark.parametrize("uri", INSIDE + ABSOLUTE)
def test_inside_and_absolute_uris_are_not(uri: str):
    assert not uris.climbs_out_of_root(uri)


def test_absolute_means_a_scheme_or_a_leading_slash():
    assert [uris.is_absolute(u) for u in ABSOLUTE] == [True] * len(ABSOLUTE)
    assert [uris.is_absolute(u) for u in ["a/b", "a/s3://b", "../x", "file:x"]] == [False] * 4


@pytest.mark.parametrize("uri", ["../../../../etc/passwd", "a/../../x"])
def test_spec_stage_refuses_a_relative_uri_that_climbs_out(uri: str):
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(SPEC.format(uri=uri), "specs/x.yaml"))
    assert [str(p) for p in caught.value.problems] == [
        f"specs/x.yaml:3:3: data.uri: {uri!r} leads outside the storage root; {FIX}"
    ]


@pytest.mark.parametrize("uri", ["file:///srv/data/x.parquet", "s3://lake/fraud/", "/srv/data/x.parquet", "a/../x.parquet"])
def test_spec_stage_accepts_absolute_uris_and_relative_ones_inside(uri: str):
    assert validate_loaded(load_yaml_text(SPEC.format(uri=uri), "specs/x.yaml")).data.uri == uri


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "storage").mkdir()
    return dataclasses.replace(Settings.from_env(), storage_root=(tmp_path / "storage").as_uri(), storage_conn_id=None)


@pytest.mark.parametrize("uri", ["../outside.csv", "a/../../outside.csv"])
def test_resolve_uri_refuses_a_relative_uri_that_climbs_out(uri: str, settings: Settings, tmp_path: Path):
    (tmp_path / "outside.csv").write_text("a\n1\n")
    with pytest.raises(OutsideStorageRootError) as caught:
        storage.resolve_uri(uri, settings)
    assert str(caught.value) == f"{uri!r} leads outside the storage root; {FIX}"
    assert isinstance(caught.value, TrainpipeError)


def test_resolve_uri_keeps_relative_uris_under_the_root(settings: Settings, tmp_path: Path):
    # "a" does not exist and "b" leads out of the root: read as written, neither path would be the
    # one the spec stage judged; normalised, both are the root's own x.csv.
    (tmp_path / "storage" / "x.csv").write_text("a\n1\n")
    (tmp_path / "outside" / "deeper").mkdir(parents=True)
    (tmp_path / "outside" / "x.csv").write_text("a\n666\n")
    (tmp_path / "storage" / "b").symlink_to(tmp_path / "outside" / "deeper", target_is_directory=True)
    for uri in ("a/../x.csv", "b/../x.csv", "./x.csv"):
        resolved = storage.resolve_uri(uri, settings)
        assert resolved.path == str(tmp_path / "storage" / "x.csv")
        assert storage.read_table(resolved, "csv")["a"].tolist() == [1]
    assert storage.resolve_uri(".", settings).path == str(tmp_path / "storage")


def test_resolve_uri_still_reads_an_absolute_uri_outside_the_root(settings: Settings, tmp_path: Path):
    elsewhere = tmp_path / "elsewhere" / "x.csv"
    elsewhere.parent.mkdir()
    elsewhere.write_text("a\n2\n")
    for uri in (elsewhere.as_uri(), str(elsewhere)):
        assert storage.read_table(storage.resolve_uri(uri, settings), "csv")["a"].tolist() == [2]


@pytest.fixture
def spec_without_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Writes a spec with ``data.uri`` (``{root}`` is the storage root) and compiles it with no policy in force."""
    from trainpipe.compile.compiler import compile_file

    root = tmp_path / "storage"
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", root.as_uri())
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)

    def compile_with(uri: str) -> tuple[str, object]:
        written = uri.format(root=root)
        spec = tmp_path / "x.yaml"
        spec.write_text(SPEC.format(uri=written))
        return written, lambda: compile_file(spec, "specs/x.yaml", settings=Settings.from_env())

    return compile_with


@pytest.mark.parametrize("uri", ["file:///etc/passwd", "/proc/self/environ", "file://localhost/etc/passwd",
                                 "FILE:///etc/passwd", "{root}/../outside.csv", "file://{root}/../outside.csv"])
def test_without_a_policy_a_local_path_outside_the_storage_root_is_refused_at_its_line(uri: str, spec_without_policy):
    written, compile_it = spec_without_policy(uri)
    with pytest.raises(SpecError) as caught:
        compile_it()
    assert [str(p) for p in caught.value.problems] == [
        f"specs/x.yaml:3:3: data.uri: {written!r} is a local path outside the storage root; without a platform policy "
        "trainpipe reads local data only under the storage root: move the data there and write its path relative to "
        "the storage root, or the platform allows the path in its policy's data.uris"]


@pytest.mark.parametrize("uri", ["{root}/demo/x.parquet", "file://{root}/demo/x.parquet", "s3://lake/fraud/", "demo/x.parquet"])
def test_without_a_policy_local_paths_under_the_root_and_object_stores_compile(uri: str, spec_without_policy):
    written, compile_it = spec_without_policy(uri)
    assert compile_it().data.uri == written
