"""The isolation builders against literal expected manifests, and their refusals."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.errors import InvalidRequest, NotFound
from policies.isolation import (
    IsolationSettings,
    TenantSpec,
    dra_device_limits,
    gpu_resource_limits,
    portal_manifests,
    tenant_manifests,
)
from policies.isolation.rbac import portal_cluster_role
from tests.policies.isolation.cases import FULL, LOCKED, SETTINGS

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> list[Any]:
    return list(yaml.safe_load_all((GOLDEN / name).read_text()))


@pytest.mark.parametrize(
    ("build", "file"),
    [
        (lambda: tenant_manifests(FULL, SETTINGS), "tenant-vision.yaml"),
        (lambda: tenant_manifests(LOCKED, SETTINGS), "tenant-audit.yaml"),
        (lambda: portal_manifests(SETTINGS), "portal.yaml"),
    ],
    ids=["full-tenant", "locked-tenant", "portal"],
)
def test_builders_match_the_golden_files(build: Any, file: str) -> None:
    assert build() == golden(file)


@pytest.mark.parametrize("spec", [FULL, LOCKED], ids=["full-tenant", "locked-tenant"])
def test_the_portal_holds_everything_the_roles_it_writes_grant(spec: TenantSpec) -> None:
    # RBAC refuses a Role that grants what its creator does not hold (no escalate verb).
    held = {
        (group, resource, verb)
        for rule in portal_cluster_role(SETTINGS)["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for role in (m for m in tenant_manifests(spec, SETTINGS) if m["kind"] == "Role"):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    missing = {v for v in rule["verbs"] if (group, resource, v) not in held}
                    assert not missing, (role["metadata"]["name"], group, resource, missing)


def test_kinds_and_order_of_a_tenant() -> None:
    kinds = [(m["kind"], m["metadata"]["name"]) for m in tenant_manifests(LOCKED, SETTINGS)]
    # Namespace first: everything else lives in it. No intra-tenant or internet policy.
    assert kinds == [
        ("Namespace", "gp-audit"),
        ("ResourceQuota", "tenant-quota"),
        ("LimitRange", "tenant-defaults"),
        ("NetworkPolicy", "default-deny"),
        ("NetworkPolicy", "allow-gateway-to-replicas"),
        ("NetworkPolicy", "allow-hub-to-notebooks"),
        ("NetworkPolicy", "allow-dns-egress"),
        ("NetworkPolicy", "allow-hub-api-egress"),
        ("Role", "tenant-admin"),
        ("RoleBinding", "tenant-admin"),
        ("ServiceAccount", "tenant-jobs"),
    ]


def test_gpu_limits_sum_models_and_round_shares_up() -> None:
    spec = TenantSpec(
        "t1",
        {"H100-80GB": 3, "A100-80GB": 2, "A100-40GB/3g.20gb": 1, "T4/share": 250, "L4/share": 1},
        cpu_millis=1000,
        memory_mib=1024,
        pods=1,
    )
    settings = IsolationSettings(shared_gpu_replicas=4, shared_gpu_resource="example.com/gpu-share")
    # Whole GPUs: 3 + 2. Shares: 251 milli at 250 milli per replica -> 1.004 -> 2 replicas.
    assert gpu_resource_limits(spec, settings) == {
        "example.com/gpu-share": 2,
        "nvidia.com/gpu": 5,
        "nvidia.com/mig-3g.20gb": 1,
    }


def test_dra_device_classes_are_capped_like_the_device_plugin_resources() -> None:
    spec = TenantSpec(
        "t1",
        {
            "H100-80GB": 3,
            "A100-80GB": 2,
            "A100-40GB/3g.20gb": 1,
            "A30-24GB/1g.6gb": 4,
            "T4/share": 9,
        },
        cpu_millis=1000,
        memory_mib=1024,
        pods=1,
    )
    settings = IsolationSettings(dra_gpu_device_class="gpus.example.com")
    # Whole GPUs of every model under the GPU class, every MIG profile under the MIG class;
    # shares have no DRA form, so no class carries them.
    assert dra_device_limits(spec, settings) == {
        "gpus.example.com.deviceclass.resource.k8s.io/devices": 5,
        "mig.nvidia.com.deviceclass.resource.k8s.io/devices": 5,
    }
    (quota,) = [m for m in tenant_manifests(spec, settings) if m["kind"] == "ResourceQuota"]
    assert quota["spec"]["hard"]["gpus.example.com.deviceclass.resource.k8s.io/devices"] == "5"


def test_builders_never_mutate_their_inputs_and_return_fresh_objects() -> None:
    before = copy.deepcopy(dict(FULL.gpu_limits))
    first = tenant_manifests(FULL, SETTINGS)
    first[3]["spec"]["policyTypes"].append("tampered")
    portal = portal_manifests(SETTINGS)
    portal[1]["rules"][0]["verbs"].clear()
    assert dict(FULL.gpu_limits) == before
    assert tenant_manifests(FULL, SETTINGS) == golden("tenant-vision.yaml")
    assert portal_manifests(SETTINGS) == golden("portal.yaml")


def test_spec_mappings_are_frozen_copies() -> None:
    limits = {"H100-80GB": 1}
    spec = TenantSpec("t1", limits, cpu_millis=1, memory_mib=1, pods=1)
    limits["H100-80GB"] = 99
    assert spec.gpu_limits["H100-80GB"] == 1
    with pytest.raises(TypeError):
        spec.gpu_limits["H100-80GB"] = 2  # type: ignore[index]


VALID_NAME = "a DNS-1123 label"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("Tenant-A", "'Tenant-A'"),
        ("a" * 64, repr("a" * 64)),
        ("équipe", "'équipe'"),
        ("", "''"),
        ("-lead", "'-lead'"),
        ("ok\n", "'ok\\n'"),
    ],
    ids=["uppercase", "too-long", "unicode", "empty", "leading-dash", "trailing-newline"],
)
def test_invalid_tenant_names_are_refused(name: str, shown: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        TenantSpec(name, {}, cpu_millis=1, memory_mib=1, pods=1)
    assert str(err.value).startswith(f"invalid tenant {shown}: expected {VALID_NAME}")


def test_a_name_too_long_for_the_namespace_prefix_is_refused() -> None:
    spec = TenantSpec("a" * 62, {}, cpu_millis=1, memory_mib=1, pods=1)
    with pytest.raises(InvalidRequest) as err:
        tenant_manifests(spec, SETTINGS)
    assert str(err.value) == (
        f"invalid tenant {'a' * 62!r}: expected at most 60 characters, so that namespace "
        "'gp-<tenant>' stays within 63"
    )


def test_a_flavor_outside_the_catalogue_is_refused_naming_the_known_ones() -> None:
    spec = TenantSpec("t1", {"B200": 1}, cpu_millis=1, memory_mib=1, pods=1)
    with pytest.raises(NotFound) as err:
        tenant_manifests(spec, SETTINGS)
    assert str(err.value) == (
        "unknown flavor 'B200'; known flavors: A100-80GB, A100-80GB/1g.10gb, "
        "A100-80GB/3g.40gb, H100-80GB, T4/share"
    )


@pytest.mark.parametrize(
    ("flavor", "message"),
    [
        ("H100-80GB/9g.99gb", "invalid MIG profile '9g.99gb' for H100-80GB: expected one of "),
        ("T4/3g.40gb", "invalid MIG-capable model T4: expected one of "),
        ("", "invalid flavor '': expected 'MODEL', 'MODEL/<mig profile>' or 'MODEL/share'"),
        ("H100 80GB", "invalid flavor H100 80GB: expected a GPU model name"),
    ],
)
def test_malformed_flavor_names_are_refused(flavor: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        TenantSpec("t1", {flavor: 1}, cpu_millis=1, memory_mib=1, pods=1)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"gpu_limits": {"H100-80GB": -1}},
            "invalid GPU limit for H100-80GB -1: expected an integer from 0 to 1000000000",
        ),
        ({"cpu_millis": -5}, "invalid cpu_millis -5: expected an integer from 0 to 1000000000"),
        ({"memory_mib": -1}, "invalid memory_mib -1: expected an integer from 0 to 1000000000"),
        ({"pods": -1}, "invalid pods -1: expected an integer from 0 to 1000000000"),
        ({"pods": True}, "invalid pods True: expected an integer from 0 to 1000000000"),
        ({"pods": 1.5}, "invalid pods 1.5: expected an integer from 0 to 1000000000"),
        ({"internet_egress": "yes"}, "invalid internet_egress 'yes': expected true or false"),
        ({"node_pool": "Pool A"}, "invalid node pool 'Pool A': expected a DNS-1123 label"),
    ],
)
def test_bad_values_are_refused(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "name": "t1",
        "gpu_limits": {},
        "cpu_millis": 1,
        "memory_mib": 1,
        "pods": 1,
    }
    with pytest.raises(InvalidRequest) as err:
        TenantSpec(**{**args, **kwargs})
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"api_server_cidrs": ("10.96.0.1",)}, None),
        ({"api_server_cidrs": ("10.96.0.1/24",)}, "invalid api_server_cidrs '10.96.0.1/24'"),
        ({"api_server_cidrs": ()}, "invalid api_server_cidrs ()"),
        ({"metadata_address": "metadata"}, "invalid metadata_address 'metadata'"),
        ({"notebook_port": 0}, "invalid notebook_port 0: expected an integer from 1 to 65535"),
        ({"namespace_prefix": "GP-"}, "invalid namespace_prefix 'GP-'"),
        ({"label_prefix": "gpuportal.io"}, "invalid label_prefix 'gpuportal.io'"),
        ({"admin_group_template": "admins"}, "invalid admin_group_template 'admins'"),
        ({"hub_pod_labels": {}}, "invalid hub_pod_labels {}"),
        ({"dns_pod_labels": {"k8s-app": "kube dns"}}, "invalid dns_pod_labels value 'kube dns'"),
        (
            {"default_cpu_limit_millis": 50},
            "invalid default_cpu_limit_millis 50: expected at least",
        ),
        ({"flavors": frozenset({"H100-80GB/7g.99gb"})}, "invalid MIG profile '7g.99gb'"),
        (
            {"dra_gpu_device_class": "GPU/nvidia"},
            "invalid dra_gpu_device_class 'GPU/nvidia': expected a DeviceClass name",
        ),
        ({"dra_mig_device_class": ""}, "invalid dra_mig_device_class ''"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], message: str | None) -> None:
    if message is None:  # a bare address is a /32
        assert IsolationSettings(**kwargs).api_server_cidrs == ("10.96.0.1/32",)
        return
    with pytest.raises(InvalidRequest) as err:
        IsolationSettings(**kwargs)
    assert str(err.value).startswith(message)
