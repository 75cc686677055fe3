"""TrainJobTrigger: the provider's Job trigger plus the Service it deletes on a user kill."""

from __future__ import annotations

from airflow.sdk._shared.module_loading import import_string

from trainpipe.triggers.kubernetes import TrainJobTrigger

KWARGS = {
    "job_name": "job-fraud-detector-multinode-1736162b-t1",
    "job_namespace": "ml-training",
    "pod_names": ["job-fraud-detector-multinode-1736162b-t1-0-abcde", "job-fraud-detector-multinode-1736162b-t1-1-fghij"],
    "pod_namespace": "ml-training",
    "base_container_name": "base",
    "kubernetes_conn_id": "kubernetes_default",
    "poll_interval": 10.0,
    "cluster_context": None,
    "config_file": None,
    "in_cluster": None,
    "get_logs": True,
    "do_xcom_push": False,
    "service_name": "job-fraud-detector-multinode-1736162b-t1",
}


def test_serialize_round_trips_exactly_with_the_service_name():
    classpath, kwargs = TrainJobTrigger(**KWARGS).serialize()

    assert classpath == "trainpipe.triggers.kubernetes.TrainJobTrigger"
    assert kwargs == KWARGS
    assert import_string(classpath)(**kwargs).serialize() == (classpath, kwargs)
