"""``/api/v1/nodes`` and ``/api/v1/capacity``: nodes, GPUs, MIG layouts, topology, capacity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from policies.errors import InvalidRequest, NotFound
from policies.placement.state import ClusterState
from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.deps import Paging, allocator, paging, requires
from portal.api.errors import ERROR_RESPONSES
from portal.api.inputs import KEY, Key, bounded
from portal.api.schemas import MAX_PAGE, CapacityOut, ErrorBody, NodeChangesOut, NodeOut, Page
from portal.errors import Expired

router = APIRouter(tags=["inventory"], responses=ERROR_RESPONSES)

# Inventory is the same for every tenant: the scope counts in any form, filtered or not.

VERSION_HEADER = "Inventory-Version"
"""Header of ``/nodes`` answers: the inventory's version when the page was read."""

TOPOLOGY = Query(description="Include `links` and `numa`; false: both are null on every node.")


def _version(alloc: Allocator, cluster: ClusterState) -> str:
    return f"{alloc.epoch}.{cluster.seq}"


@router.get(
    "/nodes",
    response_model=Page[NodeOut],
    summary="Nodes with their GPUs",
    description=(
        "Every node by name, with its GPUs, MIG layouts, free shares and (unless "
        "`topology=false`) its GPU link matrix and NUMA placement. Overviews of many nodes "
        "ask with `topology=false` (a third less to send and read for 8-GPU nodes) and read "
        "the one node they show from `/nodes/{node}`. The `Inventory-Version` header of the "
        "first page is the version to follow changes from (`/inventory/changes`)."
    ),
    responses={
        200: {
            "headers": {
                VERSION_HEADER: {
                    "description": "The inventory's version this page was read at.",
                    "schema": {"type": "string"},
                }
            }
        }
    },
)
def list_nodes(
    _caller: Annotated[Caller, requires(Scope.INVENTORY_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    response: Response,
    topology: Annotated[bool, TOPOLOGY] = True,
) -> Page[NodeOut]:
    def read(cluster: ClusterState) -> Page[NodeOut]:
        response.headers[VERSION_HEADER] = _version(alloc, cluster)
        # Only the asked page is converted: building every node's answer for each page made
        # reading 1,250 nodes in three pages cost three full conversions.
        return page.page_of(
            sorted(cluster, key=lambda st: st.name),
            lambda st: convert.node_out(st, topology=topology),
        )

    return alloc.inspect(read)


@router.get(
    "/inventory/changes",
    response_model=NodeChangesOut,
    responses={
        410: {
            "model": ErrorBody,
            "description": (
                "`since` is from before a restart, or so old (or so many nodes changed) that "
                "the portal no longer holds the changes: list `/nodes` again"
            ),
        }
    },
    summary="Nodes changed since a version",
    description=(
        "The nodes added, changed (an allocation, a release, MIG layout, schedulability) or "
        "removed since `since`: the `Inventory-Version` of a `/nodes` page or the `version` "
        "of an earlier answer. An overview of many nodes lists them once and then follows "
        "the changes, reading a few nodes instead of all of them on every refresh."
    ),
)
def node_changes(
    _caller: Annotated[Caller, requires(Scope.INVENTORY_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    since: Annotated[
        Annotated[str, bounded(KEY, 64)],
        Query(description="The version read before, e.g. `3fa2c91d0b7e.42`."),
    ],
    topology: Annotated[bool, TOPOLOGY] = True,
) -> NodeChangesOut:
    epoch, _, position = since.partition(".")
    if not position.isdigit() or not epoch:
        raise InvalidRequest(
            "since", repr(since), "an Inventory-Version read from /nodes or /inventory/changes"
        )
    seq = int(position)

    def read(cluster: ClusterState) -> NodeChangesOut:
        names = cluster.changed_since(seq) if epoch == alloc.epoch else None
        if names is None:
            raise Expired(
                f"inventory version {since} is no longer held (the portal restarted or it is "
                "too old): list /nodes again and follow its Inventory-Version"
            )
        if seq > cluster.seq:
            raise InvalidRequest(
                "since", repr(since), f"a version the portal gave (now {_version(alloc, cluster)})"
            )
        changed = sorted(set(names))
        if len(changed) > MAX_PAGE:
            raise Expired(
                f"{len(changed)} nodes changed since {since}, more than one answer holds "
                f"({MAX_PAGE}): list /nodes again"
            )
        return NodeChangesOut(
            version=_version(alloc, cluster),
            nodes=[
                convert.node_out(cluster.nodes[n], topology=topology)
                for n in changed
                if n in cluster.nodes
            ],
            removed=[n for n in changed if n not in cluster.nodes],
        )

    return alloc.inspect(read)


@router.get(
    "/nodes/{node}",
    response_model=NodeOut,
    responses={404: {"model": ErrorBody, "description": "no such node"}},
    summary="One node: GPUs, MIG layout, topology, free capacity",
)
def get_node(
    node: Annotated[Key, Path(description="The node's name.")],
    _caller: Annotated[Caller, requires(Scope.INVENTORY_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
) -> NodeOut:
    found = alloc.inspect(
        lambda cluster: convert.node_out(cluster.nodes[node]) if node in cluster.nodes else None
    )
    if found is None:
        raise NotFound("node", node)
    return found


@router.get("/capacity", response_model=list[CapacityOut], summary="Capacity per flavor")
def list_capacity(
    _caller: Annotated[Caller, requires(Scope.INVENTORY_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
) -> list[CapacityOut]:
    return [CapacityOut(flavor=f, capacity=n) for f, n in sorted(alloc.capacity.items())]
