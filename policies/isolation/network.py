"""The tenant's NetworkPolicies: deny everything, then allow exactly what a notebook needs.

NetworkPolicies are additive (a connection is allowed when any policy selecting the pod allows
it), so "always denied" destinations — the instance-metadata address and the Kubernetes API —
stay denied only because no policy here allows them: pod-selector rules never match them and
the internet rule excepts them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from policies.isolation.common import Manifest, metadata
from policies.isolation.spec import IsolationSettings, TenantSpec

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DNS_PORT = 53
ANYWHERE_V4 = "0.0.0.0/0"

DEFAULT_DENY = "default-deny"
ALLOW_HUB_INGRESS = "allow-hub-to-notebooks"
ALLOW_DNS = "allow-dns-egress"
ALLOW_HUB_API = "allow-hub-api-egress"
ALLOW_INTRA_TENANT = "allow-intra-tenant"
ALLOW_INTERNET = "allow-internet-egress"
ALLOW_GATEWAY = "allow-gateway-to-replicas"
REPLICA_ROLE = "inference-replica"
"""The ``role`` label value of inference replica pods (``replica_selector``)."""


def replica_selector(settings: IsolationSettings) -> dict[str, str]:
    """The labels every inference replica pod carries, and that the gateway's policy selects."""
    return {settings.label("role"): REPLICA_ROLE}


def _peer(namespace: str, pod_labels: Mapping[str, str]) -> dict[str, Any]:
    """Pods with ``pod_labels`` in ``namespace`` (the namespace label the apiserver sets)."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }


def _policy(
    spec: TenantSpec, settings: IsolationSettings, name: str, body: dict[str, Any]
) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(settings, name, spec.name, settings.namespace(spec.name)),
        # Every policy selects every pod of the tenant: the tenant owns its whole namespace.
        "spec": {"podSelector": {}, **body},
    }


def internet_except(settings: IsolationSettings) -> list[str]:
    """The IPv4 ranges internet egress leaves out: metadata /32, private ranges, API server."""
    anywhere = ipaddress.ip_network(ANYWHERE_V4)
    ranges = [
        f"{settings.metadata_address}/32",
        *settings.private_cidrs,
        *settings.api_server_cidrs,
    ]
    out: list[str] = []
    for cidr in ranges:
        net = ipaddress.ip_network(cidr)
        # ipBlock.except must lie within the block; IPv6 ranges have no place in a v4 block.
        if net.version == anywhere.version and str(net) not in out:
            out.append(str(net))
    return out


def network_policies(spec: TenantSpec, settings: IsolationSettings) -> list[Manifest]:
    """The tenant's NetworkPolicies, in a fixed order."""
    tcp = "TCP"
    policies = [
        _policy(spec, settings, DEFAULT_DENY, {"policyTypes": ["Ingress", "Egress"]}),
        _policy(
            spec,
            settings,
            ALLOW_GATEWAY,
            {
                # Replicas only: the gateway's port is no way into the tenant's other pods.
                "podSelector": {"matchLabels": replica_selector(settings)},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [_peer(settings.hub_namespace, settings.portal_pod_labels)],
                        "ports": [{"protocol": tcp, "port": settings.inference_port}],
                    }
                ],
            },
        ),
        _policy(
            spec,
            settings,
            ALLOW_HUB_INGRESS,
            {
                # Not the replicas: nothing but the gateway reaches them from outside.
                "podSelector": {
                    "matchExpressions": [
                        {
                            "key": settings.label("role"),
                            "operator": "NotIn",
                            "values": [REPLICA_ROLE],
                        }
                    ]
                },
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [
                            _peer(settings.hub_namespace, settings.hub_pod_labels),
                            _peer(settings.hub_namespace, settings.proxy_pod_labels),
                        ],
                        "ports": [{"protocol": tcp, "port": settings.notebook_port}],
                    }
                ],
            },
        ),
        _policy(
            spec,
            settings,
            ALLOW_DNS,
            {
                "policyTypes": ["Egress"],
                "egress": [
                    {
                        "to": [_peer(settings.dns_namespace, settings.dns_pod_labels)],
                        "ports": [
                            {"protocol": "UDP", "port": DNS_PORT},
                            {"protocol": tcp, "port": DNS_PORT},
                        ],
                    }
                ],
            },
        ),
        _policy(
            spec,
            settings,
            ALLOW_HUB_API,
            {
                "policyTypes": ["Egress"],
                "egress": [
                    {
                        "to": [_peer(settings.hub_namespace, settings.hub_pod_labels)],
                        "ports": [{"protocol": tcp, "port": settings.hub_api_port}],
                    },
                    {
                        "to": [_peer(settings.hub_namespace, settings.portal_pod_labels)],
                        "ports": [{"protocol": tcp, "port": settings.portal_api_port}],
                    },
                ],
            },
        ),
    ]
    if spec.allow_intra_tenant_traffic:
        # An empty podSelector without namespaceSelector means: pods of this namespace only.
        policies.append(
            _policy(
                spec,
                settings,
                ALLOW_INTRA_TENANT,
                {
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{"from": [{"podSelector": {}}]}],
                    "egress": [{"to": [{"podSelector": {}}]}],
                },
            )
        )
    if spec.internet_egress:
        policies.append(
            _policy(
                spec,
                settings,
                ALLOW_INTERNET,
                {
                    "policyTypes": ["Egress"],
                    "egress": [
                        {
                            "to": [
                                {
                                    "ipBlock": {
                                        "cidr": ANYWHERE_V4,
                                        "except": internet_except(settings),
                                    }
                                }
                            ]
                        }
                    ],
                },
            )
        )
    return policies
