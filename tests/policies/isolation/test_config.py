"""Isolation settings from plain data, as the service's settings file gives them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from policies.errors import InvalidRequest
from policies.isolation import IsolationSettings, isolation_settings

# A value other than the default for every field, as plain YAML data.
CHANGED: dict[str, Any] = {
    "hub_namespace": "jhub",
    "hub_pod_labels": {"component": "hub"},
    "proxy_pod_labels": {"component": "proxy"},
    "portal_pod_labels": {"app.kubernetes.io/instance": "prod", "component": "portal"},
    "hub_api_port": 8082,
    "portal_api_port": 9000,
    "notebook_port": 8889,
    "inference_port": 8081,
    "dns_namespace": "dns",
    "dns_pod_labels": {"k8s-app": "coredns"},
    "api_server_cidrs": ["10.100.0.1/32", "192.168.10.5/32"],
    "metadata_address": "169.254.169.253",
    "private_cidrs": ["10.0.0.0/8"],
    "namespace_prefix": "t-",
    "label_prefix": "gpus.example.com/",
    "admin_group_template": "oidc:{tenant}-admins",
    "jobs_service_account": "runner",
    "portal_service_account": "prod-gpuportal",
    "shared_gpu_resource": "nvidia.com/gpu.ts",
    "shared_gpu_replicas": 4,
    "dra_gpu_device_class": "gpu.example.com",
    "dra_mig_device_class": "mig.example.com",
    "flavors": ["A100-80GB", "T4"],
    "default_cpu_request_millis": 200,
    "default_memory_request_mib": 512,
    "default_cpu_limit_millis": 2000,
    "default_memory_limit_mib": 2048,
    "checkpoint_claim": "ckpt",
    "checkpoint_claim_size": "2Ti",
    "checkpoint_storage_class": "cephfs",
}


def test_every_setting_can_be_given_and_differs_from_its_default() -> None:
    names = {f.name for f in dataclasses.fields(IsolationSettings)}
    assert set(CHANGED) == names  # a new setting must be added here (and to the chart's schema)
    got = isolation_settings(CHANGED)
    default = IsolationSettings()
    for name, value in CHANGED.items():
        have = getattr(got, name)
        if isinstance(have, Mapping):
            assert dict(have) == value, name
        elif name == "flavors":
            assert have == frozenset(value)
        elif isinstance(have, tuple):
            assert list(have) == value, name
        else:
            assert have == value, name
        assert have != getattr(default, name), name


def test_keys_left_out_keep_their_defaults() -> None:
    assert isolation_settings({}) == IsolationSettings()
    got = isolation_settings({"hub_namespace": "jhub"})
    assert got == dataclasses.replace(IsolationSettings(), hub_namespace="jhub")
    assert isolation_settings({"flavors": None}).flavors is None


def test_an_unknown_key_is_named_with_the_known_ones() -> None:
    with pytest.raises(InvalidRequest) as err:
        isolation_settings({"hub_namespace": "jhub", "hub_namepsace": "x"})
    assert "'hub_namepsace'" in str(err.value)
    assert "hub_namespace" in err.value.valid and "private_cidrs" in err.value.valid


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("portal_api_port", "8000", "an integer"),
        ("shared_gpu_replicas", True, "an integer"),
        ("hub_namespace", 5, "a string"),
        ("api_server_cidrs", "10.96.0.1/32", "a list of strings"),
        ("private_cidrs", ["10.0.0.0/8", 7], "a list of strings"),
        ("flavors", "T4", "a list of strings"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_naming_the_setting(
    key: str, value: object, expected: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        isolation_settings({key: value})
    assert err.value.field == key
    assert err.value.valid == expected


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hub_namespace", "Not_A_Namespace"),
        ("hub_pod_labels", {}),
        ("api_server_cidrs", []),
        ("private_cidrs", ["10.0.0.1/8"]),
        ("portal_api_port", 70000),
        ("admin_group_template", "admins"),
        ("checkpoint_claim", "Checkpoints!"),
        ("checkpoint_claim_size", "lots"),
        ("checkpoint_claim_size", "0Gi"),
        ("checkpoint_storage_class", "Fast SSD"),
    ],
)
def test_values_the_settings_refuse_are_refused_here_too(key: str, value: object) -> None:
    with pytest.raises(InvalidRequest):
        isolation_settings({key: value})


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="a mapping of setting to value"):
        isolation_settings(["hub_namespace", "jhub"])  # type: ignore[arg-type]
