"""OpenLineage facets of a run's steps (source data -> snapshot -> model version) for the OpenLineage provider."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

# The registered model version as a dataset: namespace ``mlflow://<model>``, name ``<version>``, so that its
# OpenLineage URI (namespace/name) reads ``mlflow://<model>/<version>``.
MODEL_NAMESPACE = "mlflow://{model}"


def available() -> bool:
    """Whether the OpenLineage provider is installed (the ``[lineage]`` extra); without it nothing here runs."""
    try:
        import airflow.providers.openlineage.extractors  # noqa: F401
        import openlineage.client.facet_v2  # noqa: F401
    except ImportError:
        return False
    return True


def dataset_name(uri: str) -> tuple[str, str]:
    """OpenLineage's naming of a storage location: ``s3://bucket`` and the key; ``file`` and the absolute path."""
    parts = urlsplit(uri)
    if parts.scheme and parts.scheme != "file" and parts.netloc:
        return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/") or "/"
    return "file", parts.path if parts.scheme == "file" else uri


def _schema(schema: list[list[str]] | None):
    from openlineage.client.facet_v2 import schema_dataset

    if not schema:
        return None
    return schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=str(name), type=str(kind)) for name, kind in schema])


def _snapshot_facets(snapshot: dict[str, Any]) -> dict[str, Any]:
    from openlineage.client.facet_v2 import dataset_version_dataset

    facets: dict[str, Any] = {"version": dataset_version_dataset.DatasetVersionDatasetFacet(
        datasetVersion=snapshot["digest"])}
    schema = _schema(snapshot.get("schema"))
    if schema is not None:
        facets["schema"] = schema
    return facets


def _source(snapshot: dict[str, Any]):
    from openlineage.client.event_v2 import InputDataset

    namespace, name = dataset_name(snapshot["source_uri"])
    schema = _schema(snapshot.get("schema"))
    return InputDataset(namespace=namespace, name=name, facets={"schema": schema} if schema is not None else {})


def _snapshot_input(snapshot: dict[str, Any], input_facets: dict[str, Any] | None = None):
    from openlineage.client.event_v2 import InputDataset

    namespace, name = dataset_name(snapshot["uri"])
    return InputDataset(namespace=namespace, name=name, facets=_snapshot_facets(snapshot),
                        inputFacets=input_facets or {})


def _snapshot_output(snapshot: dict[str, Any]):
    from openlineage.client.event_v2 import OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset

    namespace, name = dataset_name(snapshot["uri"])
    stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
        rowCount=snapshot["rows"], size=snapshot.get("size_bytes"))
    return OutputDataset(namespace=namespace, name=name, facets=_snapshot_facets(snapshot),
                         outputFacets={"outputStatistics": stats})


def _model_version(registered: dict[str, Any], output: bool):
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import dataset_version_dataset

    version = str(registered["version"])
    facets = {"version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=version)}
    cls = OutputDataset if output else InputDataset
    return cls(namespace=MODEL_NAMESPACE.format(model=registered["model_name"]), name=version, facets=facets)


def _quality(validation: dict[str, Any] | None):
    """The Great Expectations results, and one assertion per drift-checked feature (its PSI and KS in ``actual``)."""
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as dq

    if not validation:
        return None
    assertions = [dq.Assertion(assertion=str(outcome["name"]), success=bool(outcome["success"]),
                               actual=None if outcome.get("observed") is None else str(outcome["observed"]))
                  for outcome in validation.get("expectations") or []]
    for feature in (validation.get("drift") or {}).get("features") or []:
        assertions.append(dq.Assertion(
            assertion="drift", column=str(feature["feature"]), success=feature["verdict"] != "fail",
            severity=feature["verdict"], actual=f"psi={feature.get('psi')} ks={feature.get('ks')}"))
    return dq.DataQualityAssertionsDatasetFacet(assertions=assertions)


def lineage_of(step: str, facts: dict[str, Any]):
    """What ``step`` (snapshot, validate, train, register, promote) read and wrote, from the ``facts`` its operator
    kept while it ran (``snapshot``, ``validation``, ``registered``); a fact a failed step did not reach leaves its
    dataset out. None without the OpenLineage provider."""
    if not available():
        return None
    from airflow.providers.openlineage.extractors import OperatorLineage

    snapshot, registered = facts.get("snapshot"), facts.get("registered")
    if not snapshot and not registered:
        return OperatorLineage()
    if step == "snapshot":
        return OperatorLineage(inputs=[_source(snapshot)], outputs=[_snapshot_output(snapshot)])
    if step == "validate":
        quality = _quality(facts.get("validation"))
        return OperatorLineage(inputs=[_snapshot_input(
            snapshot, {"dataQualityAssertions": quality} if quality is not None else None)])
    if step == "train":
        return OperatorLineage(inputs=[_snapshot_input(snapshot)])
    if step == "register":
        return OperatorLineage(inputs=[_snapshot_input(snapshot)] if snapshot else [],
                               outputs=[_model_version(registered, output=True)] if registered else [])
    # promote: the version it moved the alias to
    return OperatorLineage(inputs=[_model_version(registered, output=False)] if registered else [])


class LineageFacets:
    """Mixin for the step operators: the OpenLineage provider's listener calls these when a task ends.

    The facts come from the operator's own ``execute`` (``keep_lineage``), not from XCom: by default the listener
    runs these in a forked child of the task process, where the task's connection to Airflow cannot be used."""

    lineage_step = ""  # which of lineage_of's steps the operator is

    def keep_lineage(self, **facts: Any) -> None:
        """Record what this run of the task read or wrote (``snapshot``, ``validation``, ``registered``)."""
        self.__dict__.setdefault("_lineage_facts", {}).update(facts)

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        return lineage_of(self.lineage_step, self.__dict__.get("_lineage_facts", {}))

    def get_openlineage_facets_on_failure(self, task_instance: Any):
        return lineage_of(self.lineage_step, self.__dict__.get("_lineage_facts", {}))
