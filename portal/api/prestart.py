"""``/api/v1/prestart``: the pre-started notebook environments' plan and placeholders
(decision 0013).

The plan is made from every tenant's demand and the whole cluster's free capacity, and the
placeholders are the platform's own: platform admins only (``admin`` without a group filter).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from policies.errors import Forbidden
from policies.prestart import PrestartReason
from portal.allocator import Allocator
from portal.allocator.state import State
from portal.api.auth import Caller, Scope
from portal.api.deps import allocator, requires
from portal.api.errors import ERROR_RESPONSES
from portal.prestart.service import PrestartService

router = APIRouter(prefix="/prestart", tags=["prestart"], responses=ERROR_RESPONSES)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrestartOptionOut(_Model):
    key: str = Field(description="The spawn option (offer key).")
    flavor: str
    cost_gpus: float = Field(ge=0, description="GPU-equivalents one environment holds.")
    spawns_per_hour: float = Field(ge=0, description="Spawns of the option forecast per hour.")
    count: int = Field(ge=0, description="Environments the plan keeps started.")
    reason: PrestartReason = Field(description="Why the count is what it is.")
    held: int = Field(ge=0, description="Placeholders held now.")


class PlaceholderOut(_Model):
    id: str = Field(description="The placeholder's workload id (the platform tenant's).")
    option: str
    nodes: list[str]
    gpu_equivalent: float = Field(ge=0)
    started_at: datetime | None


class PrestartOut(_Model):
    enabled: bool = Field(description="False: no budget (GPUPORTAL_PRESTART_BUDGET_GPUS 0).")
    tenant: str | None = Field(description="The platform tenant the placeholders are charged to.")
    budget_gpus: float = Field(ge=0)
    horizon_s: float | None = Field(description="Seconds ahead the plan covers.")
    planned_at: datetime | None = Field(description="When the plan was made; null: not yet.")
    options: list[PrestartOptionOut] = Field(description="Options with demand or placeholders.")
    placeholders: list[PlaceholderOut]


def prestart_of(request: Request) -> PrestartService | None:
    """The service's pre-start pool (``gpuportal serve`` sets it), or None when off."""
    found: PrestartService | None = getattr(request.app.state, "prestart", None)
    return found


@router.get("", response_model=PrestartOut, summary="The pre-start plan and placeholders held")
def read_prestart(
    caller: Annotated[Caller, requires(Scope.ADMIN)],
    alloc: Annotated[Allocator, Depends(allocator)],
    pre: Annotated[PrestartService | None, Depends(prestart_of)],
) -> PrestartOut:
    if not caller.can_everywhere(Scope.ADMIN):
        raise Forbidden(
            f"{caller.kind} {caller.name} may not read the pre-start plan: it covers every "
            f"tenant's demand and the platform's placeholders, so it needs {Scope.ADMIN} "
            "without a group filter (platform admins)"
        )
    if pre is None:
        return PrestartOut(
            enabled=False,
            tenant=None,
            budget_gpus=0,
            horizon_s=None,
            planned_at=None,
            options=[],
            placeholders=[],
        )
    held = pre.pool.held()
    options = pre.pool.options
    plan = {t.key: t for t in pre.plan}
    listed = [
        PrestartOptionOut(
            key=key,
            flavor=spec.flavor,
            cost_gpus=spec.cost,
            spawns_per_hour=pre.rates.get(key, 0.0),
            count=plan[key].count if key in plan else 0,
            reason=plan[key].reason if key in plan else PrestartReason.NO_DEMAND,
            held=len(held.get(key, [])),
        )
        for key, spec in options.items()
        if pre.rates.get(key, 0.0) > 0 or held.get(key)
    ]
    owner = {wid: key for key, ids in held.items() for wid in ids}

    def placeholders(st: State) -> list[PlaceholderOut]:
        out = []
        for wid, key in owner.items():
            lv = st.live.get(wid)
            if lv is None:
                continue  # released since ``held`` was read
            out.append(
                PlaceholderOut(
                    id=wid,
                    option=key,
                    nodes=sorted({a.node for a in lv.allocations}),
                    gpu_equivalent=sum(a.gpu_equivalent for a in lv.allocations),
                    started_at=lv.rec.started_at,
                )
            )
        return out

    return PrestartOut(
        enabled=True,
        tenant=pre.settings.tenant,
        budget_gpus=pre.settings.budget_gpus,
        horizon_s=pre.settings.horizon_s,
        planned_at=pre.planned_at,
        options=listed,
        placeholders=alloc.read(placeholders),
    )
