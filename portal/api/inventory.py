"""``/api/v1/nodes`` and ``/api/v1/capacity``: nodes, GPUs, MIG layouts, topology, capacity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from policies.errors import NotFound
from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.deps import Paging, allocator, paging, requires
from portal.api.errors import ERROR_RESPONSES
from portal.api.schemas import CapacityOut, ErrorBody, NodeOut, Page

router = APIRouter(tags=["inventory"], responses=ERROR_RESPONSES)

# Inventory is the same for every tenant: the scope counts in any form, filtered or not.


@router.get(
    "/nodes",
    response_model=Page[NodeOut],
    summary="Nodes with their GPUs",
    description=(
        "Every node by name, with its GPUs, MIG layouts, free shares and (unless "
        "`topology=false`) its GPU link matrix and NUMA placement. Overviews of many nodes "
        "ask with `topology=false` (a third less to send and read for 8-GPU nodes) and read "
        "the one node they show from `/nodes/{node}`."
    ),
)
def list_nodes(
    _caller: Annotated[Caller, requires(Scope.INVENTORY_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    topology: Annotated[
        bool,
        Query(description="Include `links` and `numa`; false: both are null on every node."),
    ] = True,
) -> Page[NodeOut]:
    # Only the asked page is converted: building every node's answer for each page made
    # reading 1,250 nodes in three pages cost three full conversions.
    return alloc.inspect(
        lambda cluster: page.page_of(
            sorted(cluster, key=lambda st: st.name),
            lambda st: convert.node_out(st, topology=topology),
        )
    )


@router.get(
    "/nodes/{node}",
    response_model=NodeOut,
    responses={404: {"model": ErrorBody, "description": "no such node"}},
    summary="One node: GPUs, MIG layout, topology, free capacity",
)
def get_node(
    node: Annotated[str, Path(max_length=253, description="The node's name.")],
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
