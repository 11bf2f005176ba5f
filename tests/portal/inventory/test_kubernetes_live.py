"""KubernetesInventory against a real kube-apiserver (kwok nodes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes_asyncio import client as k8s_async

from portal.inventory.events import EventKind, InventoryEvent
from portal.inventory.kubernetes import KubernetesInventory
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster

pytestmark = pytest.mark.k8s

SELECTOR = "gpuportal.io/test=inventory-live"


def labelled(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["metadata"]["labels"]["gpuportal.io/test"] = "inventory-live"
    return manifest


async def next_event(
    events: AsyncIterator[InventoryEvent],
    name: str,
    matches: Callable[[InventoryEvent], bool] = lambda _: True,
) -> InventoryEvent:
    """The next event about node ``name`` that ``matches``; kwok's own status updates (Ready
    conditions and the like) may produce other events in between."""

    async def first() -> InventoryEvent:
        while True:
            event = await anext(events)
            if event.name == name and matches(event):
                return event

    return await asyncio.wait_for(first(), 30)


async def test_snapshot_then_watch_add_update_delete(k8s_cluster: K8sCluster) -> None:
    k8s_cluster.add_gpu_node(labelled(gpu_nodes.t4_pcie_node("inv-t4-1")))
    config = k8s_cluster.configure(k8s_async.Configuration())
    with k8s_cluster.api_client() as sync_api:
        core = k8s.CoreV1Api(sync_api)
        async with k8s_async.ApiClient(config) as async_api:
            inventory = KubernetesInventory(
                k8s_async.CoreV1Api(async_api), core_v1=core, label_selector=SELECTOR
            )
            nodes = inventory.snapshot()
            assert [n.name for n in nodes] == ["inv-t4-1"]
            assert [g.model for g in nodes[0].gpus] == ["T4", "T4"]

            events = inventory.watch()
            k8s_cluster.add_gpu_node(labelled(gpu_nodes.h100_nvswitch_node("inv-h100-1")))
            added = await next_event(events, "inv-h100-1")
            assert (added.kind, added.name) == (EventKind.ADDED, "inv-h100-1")
            assert added.node is not None and len(added.node.gpus) == 8

            core.patch_node("inv-t4-1", {"metadata": {"labels": {"gpuportal.io/rack": "r9"}}})
            updated = await next_event(
                events, "inv-t4-1", lambda e: e.node is not None and e.node.rack == "r9"
            )
            assert (updated.kind, updated.name) == (EventKind.UPDATED, "inv-t4-1")
            assert updated.node is not None and updated.node.rack == "r9"

            core.delete_node("inv-h100-1")
            removed = await next_event(events, "inv-h100-1", lambda e: e.node is None)
            assert (removed.kind, removed.name, removed.node) == (
                EventKind.REMOVED,
                "inv-h100-1",
                None,
            )
            await events.aclose()
            core.delete_node("inv-t4-1")
