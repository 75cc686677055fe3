"""What a Kubernetes training records of its image: the digest each node's trainer container ran (the pods'
status ``imageID``), read through the real client from an API server on 127.0.0.1 before the Job is deleted,
tagged on the MLflow run (register copies it onto the model version with the family's provenance)."""

from __future__ import annotations

import json

import pytest

from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.operators.kubernetes import KubernetesTrainJobOperator, read_pulled_images, record_pulled_images
from trainpipe.plan.tracking import MODEL_FAMILY_TAGS, TRAINER_IMAGE_DIGEST_TAG
from trainpipe.settings import Settings

JOB = "job-fraud-detector-multinode-1736162b-t1"
NAMESPACE = "ml-training"
DIGEST_A = "ghcr.io/trainpipe/trainer@sha256:" + "a" * 64
DIGEST_B = "ghcr.io/trainpipe/trainer@sha256:" + "b" * 64


@pytest.fixture
def apiserver(tmp_path, monkeypatch):
    server = FakeApiServer()
    server.start()
    monkeypatch.setenv("AIRFLOW_CONN_K8S_TEST", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(server.kubeconfig(tmp_path))}}))
    yield server
    server.stop()


def _pod(index: int, trainer_image_id: str) -> dict:
    """A pod as the API server lists it: the trainer's container and a mesh sidecar, both run."""
    def status(name: str, image: str, image_id: str) -> dict:
        return {"name": name, "image": image, "imageID": image_id, "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{JOB}-{index}-x", "namespace": NAMESPACE},
            "status": {"phase": "Succeeded", "containerStatuses": [
                status("base", "ghcr.io/trainpipe/trainer:0.1.0", trainer_image_id),
                status("istio-proxy", "istio/proxyv2:1.22", "docker.io/istio/proxyv2@sha256:" + "c" * 64)]}}


def _operator() -> KubernetesTrainJobOperator:
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml", settings=Settings.from_env())
    return KubernetesTrainJobOperator(task_id="train", plan=plan, kubernetes_conn_id="k8s_test")


def test_the_trainer_containers_image_digest_is_read_from_the_pods(apiserver):
    # containerd writes the digest as is, dockershim behind a scheme: both are the same image.
    apiserver.pods = [_pod(0, DIGEST_A), _pod(1, "docker-pullable://" + DIGEST_A)]
    operator = _operator()

    read_pulled_images(operator, lambda: operator._pods_of_job(None, JOB, NAMESPACE))

    assert operator.pulled_images == (DIGEST_A,)  # the sidecar's image is not the trainer's


def test_the_run_is_tagged_with_every_image_its_nodes_ran(apiserver, capsys):
    from mlflow import MlflowClient

    client = MlflowClient()
    experiment = client.create_experiment("pulled-images")
    run_id = client.create_run(experiment).info.run_id
    apiserver.pods = [_pod(0, DIGEST_B), _pod(1, DIGEST_A)]  # the tag moved between the two nodes' pulls
    operator = _operator()
    read_pulled_images(operator, lambda: operator._pods_of_job(None, JOB, NAMESPACE))

    record_pulled_images(operator, run_id)

    assert client.get_run(run_id).data.tags[TRAINER_IMAGE_DIGEST_TAG] == f"{DIGEST_A},{DIGEST_B}"
    assert "the nodes of this training ran different images" in capsys.readouterr().out
    assert TRAINER_IMAGE_DIGEST_TAG in MODEL_FAMILY_TAGS  # what register copies onto the version


def test_an_unreadable_pod_list_leaves_no_digest_and_fails_nothing(tmp_path, monkeypatch, capsys):
    # The API server is gone by the time the training succeeded.
    server = FakeApiServer()
    server.start()
    monkeypatch.setenv("AIRFLOW_CONN_K8S_TEST", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(server.kubeconfig(tmp_path))}}))
    server.stop()
    operator = _operator()

    read_pulled_images(operator, lambda: operator._pods_of_job(None, JOB, NAMESPACE))

    assert operator.pulled_images == ()
    assert "could not read which image the pods ran" in capsys.readouterr().out
