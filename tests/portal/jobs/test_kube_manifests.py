"""The checkpoint volume in an attempt's Job and the tenant's checkpoint claim, as built (the
cluster's side, Pod Security admitting the pods and the Job controller copying the mount into
them, is in ``test_kube_preemption.py``)."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from policies.isolation import IsolationSettings
from portal.jobs.kube import manifests as m


def objects(job_id: str = "abc123", checkpoint_dir: str = "/ckpt/run1") -> m.AttemptObjects:
    return m.AttemptObjects(
        job_id=job_id,
        attempt=2,
        tenant="team-a",
        workload_id="w1",
        members=2,
        image="registry.invalid/train:1",
        command=(),
        env={"GPUPORTAL_CHECKPOINT_DIR": checkpoint_dir},
        resources={"nvidia.com/gpu": "4"},
        checkpoint_dir=checkpoint_dir,
    )


def test_members_mount_the_tenants_claim_at_the_checkpoint_dir_with_the_jobs_sub_path() -> None:
    settings = IsolationSettings(checkpoint_claim="ckpt")
    pod = m.job_manifest(objects(), settings)["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}
    ]
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert mount == {"name": "checkpoints", "mountPath": "/ckpt/run1", "subPath": "jobs/abc123"}
    # Another job of the tenant: the same claim, another folder of it.
    other = m.job_manifest(objects("Other_Job"), settings)["spec"]["template"]["spec"]
    assert other["containers"][0]["volumeMounts"][0]["subPath"] == "jobs/other-job"
    assert not any("hostPath" in v for v in pod["volumes"])


def test_a_job_without_a_checkpoint_dir_mounts_nothing() -> None:
    pod = m.job_manifest(objects(checkpoint_dir=""), IsolationSettings())["spec"]["template"]
    assert "volumes" not in pod["spec"] and "volumeMounts" not in pod["spec"]["containers"][0]


@pytest.mark.parametrize("path", ["/", "//", "relative/dir"])
def test_a_checkpoint_dir_that_cannot_be_a_mount_point_is_refused(path: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        m.job_manifest(objects(checkpoint_dir=path), IsolationSettings())
    assert refused.value.field == "checkpoint_dir"


def test_the_claim_asks_read_write_many_of_the_configured_size_and_class() -> None:
    plain = m.checkpoint_claim_manifest("team-a", IsolationSettings())
    assert plain["metadata"]["name"] == "gpuportal-checkpoints"
    assert plain["metadata"]["namespace"] == "gp-team-a"
    assert plain["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "100Gi"}},
    }  # no class: the cluster's default
    sized = IsolationSettings(checkpoint_claim_size="2Ti", checkpoint_storage_class="cephfs")
    spec = m.checkpoint_claim_manifest("team-a", sized)["spec"]
    assert (spec["resources"]["requests"]["storage"], spec["storageClassName"]) == ("2Ti", "cephfs")
