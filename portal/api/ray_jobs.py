"""``/api/v1/ray/.../jobs``: Ray jobs — an entrypoint with a runtime environment run on a
tenant's Ray cluster, or on a one-off cluster that is deleted when the job ends.

Guarded as the cluster is: submitting and stopping need ``workloads:write`` on its tenant (and,
for users, membership of it), reading needs ``workloads:read`` on it; another tenant's token
gets 403. These routes are registered before ``/ray/{cluster_id}`` so that ``/ray/jobs`` is
never read as a cluster id.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import Field

from policies.errors import Conflict, InvalidRequest
from policies.jobs import JobState
from policies.ray import RayState
from portal.accounting.service import Accounting
from portal.allocator import Allocator
from portal.api.auth import Caller, Scope
from portal.api.cost import accounting_of
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import KEY, Label, bounded
from portal.api.jobs import (
    ABSOLUTE_PATH,
    ARG,
    ENV_NAME,
    ENV_VALUE,
    MAX_LOG_BYTES,
    JobCostOut,
    LogOut,
    cost_answer,
)
from portal.api.ray import ClusterId, RayIn, spec_of
from portal.api.schemas import ErrorBody, InModel, Model, Page
from portal.api.workloads import charge
from portal.jobs.spec import MAX_ENV
from portal.ray.jobs import RayJobs, RayJobView
from portal.ray.jobspec import MAX_ENTRYPOINT, MAX_METADATA, RayJobSpec
from portal.store import ray as stored
from portal.store.records import RayJobAttempt

router = APIRouter(prefix="/ray", tags=["ray"], responses=ERROR_RESPONSES)

RayJobId = Annotated[Annotated[str, bounded(KEY, 64)], Path(description="The Ray job's id.")]
_404: Responses = {404: {"model": ErrorBody, "description": "no such Ray job, cluster or tenant"}}
_409: Responses = {409: {"model": ErrorBody, "description": "the cluster is stopped"}}


def ray_jobs(request: Request) -> RayJobs:
    found: RayJobs = request.app.state.ray_jobs
    return found


# ------------------------------------------------------------------ bodies


class RuntimeEnvIn(InModel):
    working_dir: Annotated[str, ABSOLUTE_PATH] | None = Field(
        default=None,
        description=(
            "An existing directory on the portal's host: the driver's working directory and "
            "its tasks'. null: a directory of the portal's."
        ),
    )
    env_vars: dict[Annotated[str, ENV_NAME], Annotated[str, ENV_VALUE]] = Field(
        default_factory=dict, max_length=MAX_ENV, description="Set for the driver and its tasks."
    )
    pip: Any = Field(
        default=None,
        description=(
            "Refused unless null: only the Ray installed beside the portal runs, and a job "
            "does not install packages into that shared environment."
        ),
    )


class RayJobIn(InModel):
    entrypoint: Annotated[str, ARG] = Field(
        max_length=MAX_ENTRYPOINT,
        description="A shell command line, run as the Ray driver with RAY_ADDRESS set.",
    )
    runtime_env: RuntimeEnvIn = Field(default_factory=RuntimeEnvIn)
    metadata: dict[Annotated[str, ENV_NAME], Annotated[str, ENV_VALUE]] = Field(
        default_factory=dict, max_length=MAX_METADATA, description="Kept with the job, for people."
    )


class OneOffIn(RayJobIn):
    cluster: RayIn = Field(
        description="The cluster created for this job alone (as POST /ray), deleted when it ends."
    )


class RayJobAttemptOut(Model):
    number: int = Field(ge=1)
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None = Field(description="null while it runs, or when it never ran.")
    reason: str = Field(description="How it ended ('' while it runs).")


class RayJobOut(Model):
    id: str
    tenant: str
    owner: str
    cluster_id: str
    one_off: bool = Field(description="The cluster was created for this job and ends with it.")
    state: JobState = Field(description="queued, running, succeeded, failed or cancelled.")
    message: str = Field(description="Where it stands, as a sentence.")
    cluster_state: RayState
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, Any]
    attempt: int = Field(ge=0, description="The current attempt; 0 before the first.")
    attempts: list[RayJobAttemptOut] = Field(description="Oldest first.")
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


def attempt_out(a: RayJobAttempt) -> RayJobAttemptOut:
    return RayJobAttemptOut.model_validate(a, from_attributes=True)


def job_out(v: RayJobView) -> RayJobOut:
    j = v.job
    return RayJobOut(
        id=j.id,
        tenant=j.tenant,
        owner=j.owner,
        cluster_id=j.cluster_id,
        one_off=j.one_off,
        state=j.state,
        message=j.message,
        cluster_state=v.cluster_state,
        entrypoint=str(j.spec["entrypoint"]),
        runtime_env=dict(j.spec["runtime_env"]),  # type: ignore[call-overload]
        metadata=dict(j.spec["metadata"]),  # type: ignore[call-overload]
        attempt=j.attempt,
        attempts=[attempt_out(a) for a in j.attempts],
        created_at=j.created_at,
        updated_at=j.updated_at,
        ended_at=j.ended_at,
    )


def job_spec_of(body: RayJobIn) -> RayJobSpec:
    env = body.runtime_env
    if env.pip is not None:
        raise InvalidRequest(
            "runtime_env.pip",
            repr(env.pip)[:80],
            "null: jobs run with the Ray environment installed beside the portal",
        )
    return RayJobSpec(
        entrypoint=body.entrypoint,
        working_dir=env.working_dir,
        env_vars=tuple(sorted(env.env_vars.items())),
        metadata=tuple(sorted(body.metadata.items())),
    )


def _readable(caller: Caller, jobs: RayJobs, job_id: str) -> RayJobView:
    view = jobs.view(job_id)
    caller.require(Scope.WORKLOADS_READ, view.job.tenant)
    return view


# ------------------------------------------------------------------ routes


@router.post(
    "/jobs",
    response_model=RayJobOut,
    status_code=201,
    responses=_404,
    summary="Submit a one-off job: a cluster of its own, deleted when the job ends",
)
def submit_one_off(
    body: OneOffIn,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
) -> RayJobOut:
    """The cluster is admitted like any Ray cluster (it may wait in the queue with its
    reason); the job starts once it runs, and its end releases every slice."""
    charge(caller, body.cluster.tenant)
    spec = job_spec_of(body)
    try:
        cluster = spec_of(body.cluster, caller.name, jobs.rays.installed)
        return job_out(jobs.submit_one_off(cluster, spec))
    except InvalidRequest as exc:  # named as this body spells it
        raise InvalidRequest(f"cluster.{exc.field}", exc.value, exc.valid) from None


@router.get(
    "/jobs",
    response_model=Page[RayJobOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="List Ray jobs",
)
def list_jobs(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    state: Annotated[JobState | None, Query(description="Only this state.")] = None,
) -> Page[RayJobOut]:
    """Every Ray job the caller may see, in submission order, ended ones included."""
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    views = [v for v in jobs.jobs(shown) if state is None or v.job.state is state]
    return page.page_of(views, job_out)


@router.get("/jobs/{ray_job_id}", response_model=RayJobOut, responses=_404, summary="Read one job")
def get_job(
    ray_job_id: RayJobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
) -> RayJobOut:
    return job_out(_readable(caller, jobs, ray_job_id))


@router.get(
    "/jobs/{ray_job_id}/logs",
    response_model=LogOut,
    responses=_404,
    summary="The driver's output from a byte offset (follow by polling with next_offset)",
)
def job_logs(
    ray_job_id: RayJobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
    attempt: Annotated[
        int | None, Query(ge=1, le=1_000_000, description="Default: the current attempt.")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=1 << 50, description="Bytes to skip.")] = 0,
    limit: Annotated[
        int,
        Query(ge=1, le=MAX_LOG_BYTES, description=f"At most this many bytes (<= {MAX_LOG_BYTES})."),
    ] = 65536,
) -> LogOut:
    job = _readable(caller, jobs, ray_job_id).job
    number = attempt or max(1, job.attempt)
    if number > max(1, job.attempt):
        raise InvalidRequest("attempt", number, f"1 to {max(1, job.attempt)}")
    ended = job.state.terminal or number < job.attempt
    chunk = jobs.read_log(ray_job_id, number, offset, limit)
    return LogOut(
        job_id=ray_job_id,
        attempt=number,
        rank=0,
        offset=offset,
        next_offset=offset + len(chunk.data),
        text=chunk.data.decode("utf-8", errors="replace"),
        done=ended and offset + len(chunk.data) >= chunk.size,
        unavailable=chunk.unavailable,
    )


@router.get(
    "/jobs/{ray_job_id}/cost",
    response_model=JobCostOut,
    responses={**_404, 409: {"model": ErrorBody, "description": "not a one-off job"}},
    summary="A one-off job's GPU-hours and money: its cluster's slices, priced as /cost prices",
)
def job_cost(
    ray_job_id: RayJobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
    acc: Annotated[Accounting, Depends(accounting_of)],
) -> JobCostOut:
    """`attempts` lists the cluster's slices (each an allocator workload). A job on a
    tenant's own cluster shares it: that cluster's cost is the tenant's (`/cost`)."""
    job = _readable(caller, jobs, ray_job_id).job
    if not job.one_off:
        raise Conflict(
            f"Ray job {ray_job_id} runs on the shared cluster {job.cluster_id}: its cost is the "
            "cluster's, in /cost; only a one-off job has a cost of its own"
        )
    slices = stored.slices(jobs.rays.store, job.cluster_id)
    return cost_answer(
        acc, ray_job_id, job.tenant, [(s.number, s.workload_id, s.reason) for s in slices]
    )


@router.delete(
    "/jobs/{ray_job_id}",
    response_model=RayJobOut,
    responses=_404,
    summary="Stop: the driver stopped, a one-off job's cluster deleted (idempotent)",
)
def stop_job(
    ray_job_id: RayJobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
) -> RayJobOut:
    charge(caller, jobs.get(ray_job_id).tenant)
    return job_out(jobs.stop(ray_job_id))


@router.post(
    "/{cluster_id}/jobs",
    response_model=RayJobOut,
    status_code=201,
    responses={**_404, **_409},
    summary="Submit a job to a cluster (an idle one is resumed through admission)",
)
def submit_job(
    cluster_id: ClusterId,
    body: RayJobIn,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
) -> RayJobOut:
    charge(caller, jobs.rays.get(cluster_id).tenant)
    return job_out(jobs.submit(cluster_id, caller.name, job_spec_of(body)))


@router.get(
    "/{cluster_id}/jobs",
    response_model=Page[RayJobOut],
    responses=_404,
    summary="The jobs of one cluster",
)
def cluster_jobs(
    cluster_id: ClusterId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    jobs: Annotated[RayJobs, Depends(ray_jobs)],
    page: Annotated[Paging, Depends(paging)],
) -> Page[RayJobOut]:
    caller.require(Scope.WORKLOADS_READ, jobs.rays.get(cluster_id).tenant)
    return page.page_of(jobs.jobs(cluster_id=cluster_id), job_out)
