"""``/api/v1/tenants/{tenant}/offers``: what the tenant could ask for now, and what would happen.

Read-only: offers are decided on the allocator's state under its lock and change nothing (see
``portal.allocator.offers``). The spawner's options form is built from this answer.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from pydantic import Field

from portal.allocator import Allocator
from portal.allocator import offers as decide
from portal.api.auth import Caller, Scope
from portal.api.deps import allocator, requires
from portal.api.errors import ERROR_RESPONSES
from portal.api.inputs import Key, Label
from portal.api.schemas import DevicesIn, ErrorBody, Model

router = APIRouter(prefix="/tenants", tags=["offers"], responses=ERROR_RESPONSES)


class OfferStateOut(StrEnum):
    AVAILABLE = decide.OfferState.AVAILABLE.value
    QUEUED = decide.OfferState.QUEUED.value
    NOT_ALLOWED = decide.OfferState.NOT_ALLOWED.value


class OfferOut(Model):
    """One option and what a request for it would get now."""

    key: str = Field(
        description=(
            "Stable option id: `gpu:<model>:<count>`, `mig:<model>:<profile>`, "
            "`share:<model>:<milli>` or `cpu`."
        )
    )
    label: str = Field(description="What to show people, e.g. `4 × H100-80GB NVLink`.")
    flavor: str | None = Field(description="The quota flavor it counts against; null: CPU only.")
    devices: DevicesIn = Field(description="The `devices` of a workload request for it.")
    state: OfferStateOut = Field(
        description="available: would start now; queued: would wait; not_allowed: refused."
    )
    reason: str = Field(
        description=(
            "Empty when available. Queued: quota, capacity, topology or budget. Not allowed: "
            "no-quota, over-limit or not-in-pool."
        )
    )
    message: str = Field(description="The reason as a sentence; empty when available.")
    position: int | None = Field(
        description="1-based place in the whole queue it would get; null unless queued."
    )
    tenant_position: int | None = Field(
        description="1-based place among the tenant's queued workloads; null unless queued."
    )
    eta_s: float | None = Field(
        description="Estimated wait in seconds; null unless queued or when it cannot be estimated."
    )


def offer_out(offer: decide.Offer) -> OfferOut:
    dev = offer.option.devices
    return OfferOut(
        key=offer.option.key,
        label=offer.option.label,
        flavor=offer.option.flavor,
        devices=DevicesIn(
            kind=dev.kind,
            count=dev.count,
            models=sorted(dev.models),
            mig_profile=dev.mig_profile,
            milli=dev.milli,
            gpu_memory_mib=dev.gpu_memory_mib,
            cpu_milli=dev.cpu_milli,
            memory_mib=dev.memory_mib,
            topology=dev.topology,
        ),
        state=OfferStateOut(offer.state.value),
        reason=offer.reason,
        message=offer.message,
        position=offer.position,
        tenant_position=offer.tenant_position,
        eta_s=offer.eta_s,
    )


@router.get(
    "/{tenant}/offers",
    response_model=list[OfferOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="Options the tenant may pick, each available, queued or not allowed",
)
def list_offers(
    tenant: Annotated[Label, Path(description="The tenant (a JupyterHub group).")],
    caller: Annotated[Caller, requires(Scope.QUEUE_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    option: Annotated[
        list[Key] | None,
        Query(
            max_length=64,
            description=(
                "Only these option keys (repeatable; unknown keys are left out of the answer). "
                "Absent: every option."
            ),
        ),
    ] = None,
) -> list[OfferOut]:
    """Every option of the inventory's catalogue, decided for ``tenant`` (queue:read on it)."""
    caller.require(Scope.QUEUE_READ, tenant)
    keys = frozenset(option) if option is not None else None
    return [offer_out(o) for o in decide.offers(alloc, tenant, keys=keys)]
