"""The spec's ``data:`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from trainpipe import uris
from trainpipe.spec.sections.common import SpecModel
from trainpipe.spec.types import Duration
from trainpipe_trainer.config import DataFormat

# How a dataset version holds its rows: a copy of the window, or a manifest listing the source's files.
SnapshotMode = Literal["auto", "copy", "manifest"]

class DataSpec(SpecModel):
    uri: str = Field(
        description="Where the input lives: a path relative to the trainpipe storage root, or a full "
        "URI (file://, s3://) read through Airflow's ObjectStoragePath.",
        examples=["demo/transactions/transactions.parquet", "s3://lake/fraud/transactions/"],
    )
    format: DataFormat | None = Field(
        default=None,
        description="File format; inferred from the URI's extension when omitted.",
        examples=["parquet"],
    )
    conn_id: str | None = Field(
        default=None,
        description="Airflow connection used to read the URI (credentials stay in Airflow, never in YAML).",
        examples=["aws_default"],
    )
    time_column: str | None = Field(
        default=None,
        description="Timestamp column used to cut the window relative to the run's logical date.",
        examples=["event_time"],
    )
    window: Duration | None = Field(
        default=None,
        description="Keep rows with time_column in (logical_date - window, logical_date]. Needs time_column.",
        examples=["30d"],
    )

    snapshot: SnapshotMode = Field(
        default="auto",
        description="How the snapshot step stores a dataset version. copy: the window's rows are copied into "
        "train/holdout parquet files (split by a hash of each row). manifest: the version lists the source's "
        "parquet files (size, ETag/VersionId or mtime, row groups), nothing is copied, and the holdout is chosen "
        "per row group; a file changed after the snapshot stops every reader. A manifest versions whole files, so "
        "it takes no window or time_column and no csv. auto: manifest for a folder or prefix of parquet files "
        "of 256 MiB or more, else copy.",
        examples=["auto", "manifest"],
    )

    @field_validator("uri")
    @classmethod
    def _inside_storage_root(cls, uri: str) -> str:
        # By its text alone: the spec stage reads no storage.
        problem = uris.spec_uri_problem(uri)
        if problem is not None:
            raise ValueError(problem)
        return uri

    @property
    def resolved_format(self) -> str:
        if self.format:
            return self.format
        return "csv" if self.uri.lower().rstrip("/").endswith(".csv") else "parquet"
