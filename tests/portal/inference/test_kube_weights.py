"""The weight cache's objects on Kubernetes as built (``kubeweights``), against a golden file;
the cluster's side (the apiserver admitting them under restricted Pod Security, kwok running
the fetch) is in ``test_kube_services.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from policies.isolation import IsolationSettings
from policies.services import ModelRef
from portal.inference import fetch
from portal.inference import kubeobjects as ko
from portal.inference import kubeweights as kw
from tests.portal.inference.test_kube_objects import ALLOCATION

GOLDEN = Path(__file__).parent / "golden"
SETTINGS = IsolationSettings()
CONFIG = kw.CacheConfig("/var/lib/gpuportal/weights/", "registry.example/gpuportal:1", 2**30)
MODEL = ModelRef("https://models.example/org/tiny.safetensors", "sha256:" + "ab" * 32)
RESTRICTED_VOLUMES = {"persistentVolumeClaim", "emptyDir", "configMap", "secret", "projected",
                      "downwardAPI", "csi", "ephemeral"}  # fmt: skip


def volume_kinds(pod_spec: dict[str, Any]) -> set[str]:
    return {k for v in pod_spec["volumes"] for k in v if k != "name"}


def test_the_fetch_job_matches_the_golden_file_and_uses_only_restricted_volumes() -> None:
    job = kw.fetch_job("node-1", "team-a", MODEL, CONFIG, SETTINGS)
    assert job == yaml.safe_load((GOLDEN / "weight-fetch-job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    assert volume_kinds(pod) <= RESTRICTED_VOLUMES
    assert pod["nodeName"] == "node-1" and "nvidia.com/gpu" not in str(pod["containers"])
    # Refusals end the Job at once; only a source that failed is tried again.
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["onExitCodes"]["values"] == [fetch.USAGE, fetch.MISMATCH, fetch.TOO_LARGE]


def test_an_evict_job_is_the_fetch_pod_running_evict_and_a_declared_size_is_recorded() -> None:
    fetch_job = kw.fetch_job("node-1", "team-a", MODEL, CONFIG, SETTINGS)
    evict = kw.evict_job("node-1", "team-a", MODEL.digest, CONFIG, SETTINGS)
    assert evict["metadata"]["name"] == kw.evict_job_name("node-1", MODEL.digest)
    assert evict["metadata"]["name"] != fetch_job["metadata"]["name"]
    assert evict["metadata"]["labels"][SETTINGS.label("component")] == kw.EVICT_COMPONENT
    pod, fetch_pod = evict["spec"]["template"]["spec"], fetch_job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == [
        "python", "-m", "portal.inference.fetch", "--evict", MODEL.digest, kw.CACHE,
    ]  # fmt: skip
    # Everything else is the fetch pod's: the node, the claim, the restrictions.
    assert {**container, "command": None} == {**fetch_pod["containers"][0], "command": None}
    assert {k: v for k, v in pod.items() if k != "containers"} == {
        k: v for k, v in fetch_pod.items() if k != "containers"
    }
    assert volume_kinds(pod) <= RESTRICTED_VOLUMES
    sized = kw.fetch_job("node-1", "team-a", MODEL, CONFIG, SETTINGS, size=1234)
    got = kw.fetch_job_view(sized, SETTINGS)
    assert got is not None and got.declared == 1234
    assert kw.fetch_job_view(evict, SETTINGS) is None
    seen = kw.fetch_job_view(evict, SETTINGS, kw.EVICT_COMPONENT)
    assert seen is not None and (seen.node, seen.digest) == ("node-1", MODEL.digest)


def test_a_tenant_s_volume_is_its_own_folder_on_one_node_bound_to_its_claim() -> None:
    volume = kw.cache_volume("node-1", "team-a", CONFIG, SETTINGS)
    claim = kw.cache_claim("node-1", "team-a", CONFIG, SETTINGS)
    namespace = SETTINGS.namespace("team-a")
    assert volume["spec"]["local"]["path"] == f"/var/lib/gpuportal/weights/{namespace}"
    assert volume["spec"]["claimRef"] == {"namespace": namespace, "name": claim["metadata"]["name"]}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["node-1"]
    # Another tenant or node: other objects; names stay within the apiserver's limits.
    other = kw.cache_volume("node-1", "team-b", CONFIG, SETTINGS)
    assert other["metadata"]["name"] != volume["metadata"]["name"]
    long_node = "n" * 250
    assert len(kw.volume_name(long_node, "gp-" + "t" * 60)) <= 253
    assert len(kw.claim_name(long_node)) <= 63
    assert len(kw.fetch_job_name(long_node, MODEL.digest)) <= 63


def test_a_replica_mounts_the_entry_read_only_and_nothing_without_a_cached_model() -> None:
    base = ko.ReplicaObjects(
        service_id="s" * 32, tenant="team-a", number=1, workload_id="w-7",
        allocation=ALLOCATION, image="img", command=("serve", kw.MOUNT), env={},
        health_path="/health",
    )  # fmt: skip
    plain = ko.replica_pod(base, SETTINGS)
    assert "weights" not in str(plain["spec"]["volumes"])
    cached = ko.replica_pod(ko.ReplicaObjects(**{**_fields(base), "weights": MODEL.digest}),
                            SETTINGS)  # fmt: skip
    assert volume_kinds(cached["spec"]) <= RESTRICTED_VOLUMES
    assert cached["spec"]["volumes"][-1] == {
        "name": "weights",
        "persistentVolumeClaim": {"claimName": kw.claim_name(ALLOCATION.node), "readOnly": True},
    }
    assert cached["spec"]["containers"][0]["volumeMounts"][-1] == {
        "name": "weights", "mountPath": kw.MOUNT, "subPath": "ab" * 32, "readOnly": True,
    }  # fmt: skip


def _fields(o: ko.ReplicaObjects) -> dict[str, Any]:
    return {name: getattr(o, name) for name in o.__slots__}  # type: ignore[attr-defined]


def test_a_failed_fetch_says_why_from_its_exit_code_or_the_job() -> None:
    mismatch = kw.failure_reason(fetch.MISMATCH, "invalid model.digest sha256:...\n")
    assert mismatch.startswith(fetch.EXIT_REASONS[fetch.MISMATCH])
    assert mismatch.endswith("invalid model.digest sha256:...")
    assert kw.failure_reason(137, "") == "the fetch pod failed (exit code 137)"
    late = kw.failure_reason(None, "Job was active longer than specified deadline")
    assert late == "the fetch did not finish: Job was active longer than specified deadline"


def test_a_fetch_job_reads_as_running_done_failed_or_being_replaced() -> None:
    job: dict[str, Any] = kw.fetch_job("node-1", "team-a", MODEL, CONFIG, SETTINGS)

    def view(status: dict[str, Any], deleting: bool = False) -> kw.FetchJob | None:
        meta = {
            **job["metadata"],
            **({"deletionTimestamp": "2026-12-07T00:00:00Z"} if deleting else {}),
        }
        return kw.fetch_job_view({**job, "metadata": meta, "status": status}, SETTINGS)

    failed = {
        "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]
    }
    done = {
        "conditions": [{"type": "Complete", "status": "True"}],
        "completionTime": "2026-12-07T10:00:00Z",
    }
    assert view({}) == kw.FetchJob(
        SETTINGS.namespace("team-a"),
        "team-a",
        "node-1",
        MODEL.digest,
        kw.FetchState.RUNNING,
        "",
        "",
        name=kw.fetch_job_name("node-1", MODEL.digest),
    )
    got = view(done)
    assert got is not None and (got.state, got.finished_at) == (
        kw.FetchState.DONE,
        "2026-12-07T10:00:00Z",
    )
    got = view(failed)
    assert got is not None and (got.state, got.message) == (
        kw.FetchState.FAILED,
        "BackoffLimitExceeded",
    )
    got = view(failed, deleting=True)
    assert got is not None and got.state is kw.FetchState.RUNNING
    other = {**job, "metadata": {**job["metadata"], "labels": {}}}
    assert kw.fetch_job_view(other, SETTINGS) is None
