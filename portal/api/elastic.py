"""``/api/v1/tenants/{tenant}/elastic``: a tenant's policy for elastic training jobs (when
they grow and when they give back a slice), and the limits its own admins edit it within."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Response

from policies.elastic import ElasticLimits, ElasticSettings
from policies.errors import Conflict
from portal.api.auth import Caller, Scope
from portal.api.deps import etag, expected_version, refused_edit, requires
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import Label
from portal.api.jobs import jobs
from portal.api.schemas import ElasticIn, ElasticLimitsIO, ElasticOut, ErrorBody
from portal.jobs.controller import JobController
from portal.store.records import ElasticSettingsRecord

router = APIRouter(tags=["quotas"], responses=ERROR_RESPONSES)

TenantName = Annotated[Label, Path(description="The tenant (JupyterHub group).")]
_404: Responses = {404: {"model": ErrorBody, "description": "no such tenant"}}
_EDIT: Responses = {
    **_404,
    403: {
        "model": ErrorBody,
        "description": "not this tenant's admin, outside the platform admin's limits, or "
        "limits from someone other than a platform admin",
    },
    412: {"model": ErrorBody, "description": "changed since the ETag was read"},
    428: {"model": ErrorBody, "description": "If-Match missing"},
}


def _out(r: ElasticSettingsRecord) -> ElasticOut:
    s, lim = r.settings, r.limits
    return ElasticOut(
        tenant=r.tenant,
        threshold=s.threshold,
        window_s=s.window_s,
        idle_s=s.idle_s,
        idle_below=s.idle_below,
        limits=ElasticLimitsIO(
            min_threshold=lim.min_threshold,
            min_window_s=lim.min_window_s,
            max_idle_s=lim.max_idle_s,
        ),
        version=r.version,
    )


@router.get(
    "/tenants/{tenant}/elastic",
    response_model=ElasticOut,
    responses=_404,
    summary="Read a tenant's elastic-job policy",
)
def get_elastic(
    tenant: TenantName,
    response: Response,
    caller: Annotated[Caller, requires(Scope.QUOTAS_READ)],
    controller: Annotated[JobController, Depends(jobs)],
) -> ElasticOut:
    caller.require(Scope.QUOTAS_READ, tenant)
    rec = controller.elastic.stored(tenant)
    response.headers["ETag"] = etag(rec.version)
    return _out(rec)


@router.put(
    "/tenants/{tenant}/elastic",
    response_model=ElasticOut,
    responses=_EDIT,
    summary="Set a tenant's elastic-job policy",
    description=(
        "Tenant admins set the policy within the limits a platform admin "
        "(`custom:gpuportal:admin`) set for the tenant; only platform admins set the limits. "
        'Send `If-Match: "<version>"` (the ETag read), or `If-None-Match: *` while the '
        "version is 0."
    ),
)
def put_elastic(
    tenant: TenantName,
    body: ElasticIn,
    response: Response,
    caller: Annotated[Caller, requires(Scope.QUOTAS_WRITE)],
    controller: Annotated[JobController, Depends(jobs)],
    if_match: Annotated[str | None, Header(description='The ETag read, e.g. "3".')] = None,
    if_none_match: Annotated[str | None, Header(description="`*`: create only.")] = None,
) -> ElasticOut:
    caller.require(Scope.QUOTAS_WRITE, tenant)
    expected = expected_version(if_match, if_none_match)
    settings = ElasticSettings(
        threshold=body.threshold,
        window_s=body.window_s,
        idle_s=body.idle_s,
        idle_below=body.idle_below,
    )
    limits = None
    if body.limits is not None:
        limits = ElasticLimits(
            min_threshold=body.limits.min_threshold,
            min_window_s=body.limits.min_window_s,
            max_idle_s=body.limits.max_idle_s,
        )
    try:
        rec = controller.elastic.save(
            tenant,
            settings,
            limits,
            platform=caller.can_everywhere(Scope.ADMIN),
            expected_version=expected,
        )
    except Conflict as exc:
        current = controller.elastic.stored(tenant).version
        raise refused_edit("elastic settings", tenant, expected, current, exc) from exc
    response.headers["ETag"] = etag(rec.version)
    return _out(rec)
