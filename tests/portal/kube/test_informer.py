"""The informer against the real apiserver: a list, then a watch that follows creations,
changes and deletions (ConfigMaps stand in for any kind), and its groups."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client

from portal.kube.informer import Informer
from tests.support.k8s import K8sCluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

NAMESPACE = "informer-test"
LABEL = "informer.gpuportal.test/group"


@pytest.fixture(scope="module")
def core(k8s_cluster: K8sCluster) -> Iterator[client.CoreV1Api]:
    k8s_cluster.create_namespace(NAMESPACE)
    with k8s_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        yield core
        core.delete_namespace(NAMESPACE)


def config_map(name: str, group: str | None, value: str = "1") -> Any:
    labels = {LABEL: group} if group else {}
    return {"metadata": {"name": name, "labels": labels}, "data": {"value": value}}


def group_of(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL)


def names(objects: list[dict[str, Any]]) -> set[str]:
    return {o["metadata"]["name"] for o in objects}


def test_an_informer_lists_then_follows_creations_changes_and_deletions(
    core: client.CoreV1Api,
) -> None:
    core.create_namespaced_config_map(NAMESPACE, config_map("before", "a"))
    core.create_namespaced_config_map(NAMESPACE, config_map("unlabelled", None))
    # The generated method takes the namespace first: bind it.
    informer = Informer(
        lambda **kw: core.list_namespaced_config_map(NAMESPACE, **kw),
        name="config-maps",
        index=group_of,
        label_selector=LABEL,
    )
    informer.start()
    try:
        # Listed before start returned: no wait, and the selector left the other one out.
        assert names(informer.items()) == {"before"}
        assert names(informer.by("a")) == {"before"}

        core.create_namespaced_config_map(NAMESPACE, config_map("after", "b"))
        eventually(lambda: informer.get(NAMESPACE, "after"), "the watch seeing a creation")
        assert names(informer.by("b")) == {"after"}

        # A change of group moves the object between groups.
        core.patch_namespaced_config_map("after", NAMESPACE, config_map("after", "a", "2"))
        eventually(
            lambda: True if names(informer.by("a")) == {"before", "after"} else None,
            "the watch seeing a change",
        )
        assert informer.by("b") == []
        assert (informer.get(NAMESPACE, "after") or {})["data"] == {"value": "2"}

        core.delete_namespaced_config_map("before", NAMESPACE)
        eventually(
            lambda: True if informer.get(NAMESPACE, "before") is None else None,
            "the watch seeing a deletion",
        )
        assert names(informer.items()) == {"after"} and names(informer.by("a")) == {"after"}
    finally:
        informer.stop()
    assert not informer.running
    # Stopped: later changes are not followed.
    core.delete_namespaced_config_map("after", NAMESPACE)
    time.sleep(1)
    assert names(informer.items()) == {"after"}
    core.delete_namespaced_config_map("unlabelled", NAMESPACE)
