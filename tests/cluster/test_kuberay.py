"""`datapipe cluster kuberay`: the RayJob manifest parses and carries what KubeRay needs to run a pipeline."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from datapipe.cli import main
from tests.support.k8s_crd import crd_schema
from tests.support.shared_data import PROJECT_ROOT, shared_path

DEMO = PROJECT_ROOT / "pipelines" / "demo.yaml"


def _render(*args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["cluster", "kuberay", *args])
    assert result.exit_code == 0, result.output
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]  # warnings go to stderr


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    return template["template"]["spec"]["containers"]


def test_rayjob_carries_entrypoint_groups_image_pipeline_and_resources() -> None:
    docs = _render(
        str(DEMO), "--output", "s3://bucket/runs/demo", "--workers", "3", "--max-workers", "5",
        "--worker-cpu", "8", "--worker-memory", "32Gi", "--head-cpu", "1", "--head-memory", "4Gi",
        "--image", "registry.example/datapipe:1", "--secret", "s3-creds", "--endpoint-url", "http://minio:9000",
    )  # fmt: skip
    assert [d["kind"] for d in docs] == ["ConfigMap", "RayJob"]
    configmap, job = docs
    # the pipeline file travels byte for byte (comments included) in the ConfigMap
    assert configmap["data"]["pipeline.yaml"] == DEMO.read_text(encoding="utf-8")
    assert job["apiVersion"] == "ray.io/v1" and job["metadata"]["name"] == "demo"
    spec = job["spec"]
    assert shlex.split(spec["entrypoint"]) == [
        "datapipe", "run", "/etc/datapipe/pipeline.yaml", "--ray-address", "auto", "--no-progress",
        "--output", "s3://bucket/runs/demo",
    ]  # fmt: skip
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == "2.60.0"
    head, (workers,) = cluster["headGroupSpec"], cluster["workerGroupSpecs"]
    # fields KubeRay's CRD requires: rayStartParams and template on the head; groupName,
    # rayStartParams, template (and the replica counts) on a worker group
    assert isinstance(head["rayStartParams"], dict) and isinstance(workers["rayStartParams"], dict)
    assert head["rayStartParams"]["num-cpus"] == "0"  # no task beside the GCS and the driver
    assert "num-cpus" not in workers["rayStartParams"]  # workers: every core of their pod
    assert workers["groupName"] == "workers"
    assert (workers["replicas"], workers["minReplicas"], workers["maxReplicas"]) == (3, 3, 5)
    for group, cpu, memory in ((head, "1", "4Gi"), (workers, "8", "32Gi")):
        (container,) = _containers(group)
        assert container["image"] == "registry.example/datapipe:1"
        want = {"cpu": cpu, "memory": memory}
        assert container["resources"] == {"requests": want, "limits": want}
        (mount,) = container["volumeMounts"]
        (volume,) = group["template"]["spec"]["volumes"]
        assert mount["name"] == volume["name"] and mount["mountPath"] == "/etc/datapipe"
        assert volume["configMap"]["name"] == configmap["metadata"]["name"]
        env = {e["name"]: e for e in container["env"]}
        # credentials are referenced from the Secret, never written into the manifest
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": key}}}
        assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio:9000"
    assert {p["containerPort"] for p in _containers(head)[0]["ports"]} >= {6379, 8265}


def test_pipeline_inside_the_image_needs_no_configmap(tmp_path: Path) -> None:
    missing = tmp_path / "not-here.yaml"  # only its name is used: the file lives in the image
    (job,) = _render(str(missing), "--pipeline-in-image", "/opt/pipelines/cc.yaml", "--name", "CC_run")
    assert job["metadata"]["name"] == "cc-run"
    assert shlex.split(job["spec"]["entrypoint"])[:3] == ["datapipe", "run", "/opt/pipelines/cc.yaml"]
    for group in (job["spec"]["rayClusterSpec"]["headGroupSpec"], *job["spec"]["rayClusterSpec"]["workerGroupSpecs"]):
        assert "volumes" not in group["template"]["spec"] and "env" not in _containers(group)[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "4", "--max-workers", "2"], "--max-workers 2"),
        (["--name", "!!!"], "--name"),
    ],
)
def test_bad_options_are_refused_by_name(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["cluster", "kuberay", str(DEMO), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_rayjob_and_its_raycluster_validate_against_kuberays_crds() -> None:
    """The rendered RayJob, and its rayClusterSpec as a RayCluster, against KubeRay's own CRD schemas
    (../shared/data/k8s/, objects closed so that a misspelt field fails instead of being pruned)."""
    rayjobs, rayclusters = shared_path("k8s", "ray.io_rayjobs.yaml"), shared_path("k8s", "ray.io_rayclusters.yaml")
    # (jsonschema.validate would check the 1 MB schemas themselves on every call: validators, once)
    job_schema, cluster_schema = (
        jsonschema.Draft7Validator(crd_schema(rayjobs)),
        jsonschema.Draft7Validator(crd_schema(rayclusters)),
    )
    for args in (
        [str(DEMO), "--output", "s3://bucket/runs/demo", "--secret", "s3", "--endpoint-url", "http://minio:9000"],
        [str(DEMO), "--pipeline-in-image", "/opt/p.yaml", "--min-workers", "0", "--max-workers", "8", "--name", "x"],
    ):
        job = _render(*args)[-1]
        job_schema.validate(job)
        cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": job["metadata"]}
        cluster_schema.validate({**cluster, "spec": job["spec"]["rayClusterSpec"]})
    # The check is not vacuous: a misspelt field and a replica count as a string are refused.
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    for bad in ({**group, "rayStartParam": {}}, {**group, "replicas": "3"}):
        broken = {**job, "spec": {**job["spec"], "rayClusterSpec": {**job["spec"]["rayClusterSpec"], "workerGroupSpecs": [bad]}}}
        with pytest.raises(jsonschema.ValidationError):
            job_schema.validate(broken)
