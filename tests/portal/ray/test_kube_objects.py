"""The Kubernetes Ray backend's pure part: the RayCluster it writes, and which worker pod uses
which allocation (``portal.ray.kubeobjects``)."""

from __future__ import annotations

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings
from policies.requests import DeviceRequest
from portal.jobs.kube.admission import wants_portal
from portal.jobs.kube.manifests import JobKeys
from portal.kube.keys import PodKeys
from portal.kube.views import PodView
from portal.ray import kubeobjects as ko

SETTINGS = IsolationSettings()
KEYS = PodKeys.of(SETTINGS)


def pod(name: str, mark: tuple[str, str] | None = None, node: str | None = None) -> PodView:
    labels = {KEYS.workload: mark[0], KEYS.allocation: mark[1]} if mark else {}
    return PodView("ns", name, f"uid-{name}", "gpuportal", node, "Pending", labels, {})


def objects(**kw: object) -> ko.RayClusterObjects:
    base: dict[str, object] = {
        "cluster_id": "abcdef0123456789",
        "tenant": "team-a",
        "image": "ray:1",
        "ray_version": "2.60.0",
        "devices": DeviceRequest(kind=FlavorKind.GPU, count=2),
        "head_cpus": 1,
        "worker_cpus": 2,
        "min_workers": 2,
        "max_workers": 4,
        "replicas": 3,
    }
    return ko.RayClusterObjects(**{**base, **kw})  # type: ignore[arg-type]


def test_the_raycluster_is_in_the_tenant_namespace_and_every_pod_is_the_portals() -> None:
    m = ko.raycluster_manifest(objects(workers_to_delete=("w-1",)), SETTINGS)
    assert (m["apiVersion"], m["kind"]) == ("ray.io/v1", "RayCluster")
    assert m["metadata"]["namespace"] == SETTINGS.namespace("team-a")
    assert m["metadata"]["name"] == "ray-abcdef012345"
    head = m["spec"]["headGroupSpec"]
    [group] = m["spec"]["workerGroupSpecs"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 2, 4)
    assert group["scaleStrategy"] == {"workersToDelete": ["w-1"]}
    assert group["rayStartParams"]["num-gpus"] == "2"
    assert m["spec"]["suspend"] is False
    assert ko.raycluster_manifest(objects(suspend=True), SETTINGS)["spec"]["suspend"] is True
    for template in (head["template"], group["template"]):
        spec = template["spec"]
        assert spec["schedulerName"] == "gpuportal"
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert template["metadata"]["labels"][SETTINGS.label("tenant")] == "team-a"
    head_res = head["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker_res = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in head_res
    assert (worker_res["nvidia.com/gpu"], worker_res["cpu"], worker_res["memory"]) == (
        "2",
        "2",
        "4096Mi",
    )


def test_placed_allocations_go_to_unmarked_pods_and_the_rest_wait_with_their_slice() -> None:
    slices = [ko.SliceHold(1, "w1", ("a1", "a2")), ko.SliceHold(2, "w2", ())]
    # p0 already uses a2; p1 and p2 are new; p3 is left over.
    pods = [pod("p0", ("w1", "a2"), node="n1"), pod("p1"), pod("p2"), pod("p3")]
    plan = ko.plan_workers(pods, slices, KEYS)
    assert [(m.pod.name, m.workload_id, m.allocation_id) for m in plan.marks] == [
        ("p1", "w1", "a1"),
        ("p2", "w2", ko.QUEUED_ALLOCATION),
        ("p3", "w2", ko.QUEUED_ALLOCATION),
    ]
    assert plan.delete == ()


def test_a_pod_already_waiting_is_not_marked_again_and_gets_its_allocation_when_placed() -> None:
    waiting = pod("p1", ("w2", ko.QUEUED_ALLOCATION))
    assert ko.plan_workers([waiting], [ko.SliceHold(2, "w2", ())], KEYS).marks == ()
    [mark] = ko.plan_workers([waiting], [ko.SliceHold(2, "w2", ("a3",))], KEYS).marks
    assert (mark.workload_id, mark.allocation_id) == ("w2", "a3")


def test_pods_of_a_released_slice_are_deleted_and_the_gangs_kept() -> None:
    slices = [ko.SliceHold(1, "w1", ("a1", "a2"))]
    pods = [
        pod("p0", ("w1", "a1"), node="n1"),
        pod("p1", ("w1", "a2"), node="n1"),
        pod("p2", ("w2", "a3"), node="n1"),  # slice 2, released
        pod("p3", ("w2", ko.QUEUED_ALLOCATION)),  # a waiting pod of slice 2
    ]
    plan = ko.plan_workers(pods, slices, KEYS)
    assert plan.marks == ()
    assert plan.delete == ("p2", "p3")


def test_two_pods_never_share_an_allocation() -> None:
    slices = [ko.SliceHold(1, "w1", ("a1",))]
    plan = ko.plan_workers([pod("p0", ("w1", "a1")), pod("p1", ("w1", "a1"))], slices, KEYS)
    # p1's claim is a duplicate, and no allocation is free for it: it is left unbound.
    assert plan.marks == () and plan.delete == ()


def driver(**kw: object) -> ko.DriverObjects:
    base: dict[str, object] = {
        "job_id": "fedcba9876543210",
        "attempt": 2,
        "cluster_id": "abcdef0123456789",
        "tenant": "team-a",
        "image": "ray:1",
        "address": "ray-abcdef012345-head-svc.gp-team-a.svc:6379",
        "entrypoint": "python train.py --epochs 3",
        "env_vars": (("EPOCHS", "3"), ("PYTHONUNBUFFERED", "0")),
        "job_config": '{"runtime_env": {"env_vars": {"EPOCHS": "3"}}}',
    }
    return ko.DriverObjects(**{**base, **kw})  # type: ignore[arg-type]


def test_a_driver_is_one_restricted_deviceless_pod_that_reads_the_token_from_the_secret() -> None:
    m = ko.driver_job_manifest(driver(), SETTINGS)
    assert (m["apiVersion"], m["kind"]) == ("batch/v1", "Job")
    meta = m["metadata"]
    assert (meta["name"], meta["namespace"]) == ("rayjob-fedcba987654-2", "gp-team-a")
    assert meta["labels"][SETTINGS.label("ray-job")] == "fedcba9876543210"
    assert meta["labels"][SETTINGS.label("ray-job-attempt")] == "2"
    assert meta["labels"][SETTINGS.label("ray-cluster")] == "abcdef0123456789"
    # One run: a retry is the portal's next attempt, never the Job controller's.
    assert (m["spec"]["backoffLimit"], m["spec"]["completions"]) == (0, 1)
    pod = m["spec"]["template"]["spec"]
    assert pod["schedulerName"] == "gpuportal" and pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["command"] == ["/bin/sh", "-c", "python train.py --epochs 3"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    env = {e["name"]: e for e in container["env"]}
    assert env["RAY_ADDRESS"]["value"] == "ray-abcdef012345-head-svc.gp-team-a.svc:6379"
    assert env["EPOCHS"]["value"] == "3"
    assert env["RAY_AUTH_TOKEN"] == {
        "name": "RAY_AUTH_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "ray-abcdef012345-auth", "key": ko.TOKEN_KEY}},
    }
    # A variable the portal sets is set once, to the portal's value.
    assert [e["value"] for e in container["env"] if e["name"] == "PYTHONUNBUFFERED"] == ["1"]
    # The portal's own Job: kubectl admission does not take it for a training job.
    assert not wants_portal(m, JobKeys.of(SETTINGS))
    unlabelled = {**m, "metadata": {**meta, "labels": {}}}
    assert wants_portal(unlabelled, JobKeys.of(SETTINGS))
