"""``/api/v1/jobs``: training jobs — submit, read, cancel, their attempts and their logs.

A job is charged to a tenant like a workload, and guarded the same way: submitting and
cancelling need ``workloads:write`` on the tenant (and, for users, membership of it), reading
needs ``workloads:read`` on it; another tenant's token gets 403.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import Field

from policies.errors import InvalidRequest
from policies.jobs import MAX_BACKOFF_S, MAX_EXIT_CODES, MAX_RESTARTS, JobState, RestartPolicy
from policies.jobs import TopologyMode as Mode
from policies.requests import MAX_GANG_SIZE, MAX_PRIORITY, TopologyRequirement
from portal.accounting.service import Accounting
from portal.accounting.workloads import workload_costs
from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.cost import MONEY, accounting_of, money_text
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import KEY, Label, StringRule, Text, bounded
from portal.api.schemas import DevicesIn, ErrorBody, InModel, Model, Page, WorkloadOut
from portal.api.workloads import charge
from portal.jobs.controller import JobController, JobView
from portal.jobs.spec import MAX_ARGS, MAX_ENV, JobSpec, device_request
from portal.store import jobs as stored_jobs
from portal.store.records import AttemptRecord

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=ERROR_RESPONSES)

JobId = Annotated[Annotated[str, bounded(KEY, 64)], Path(description="The job's id.")]
_404: Responses = {404: {"model": ErrorBody, "description": "no such job or tenant"}}
MAX_LOG_BYTES = 1 << 20

ARG = StringRule(r"^[^\u0000\ud800-\udfff]+$", 4096, "text without NUL or lone surrogates")
ABSOLUTE_PATH = StringRule(r"^/[^\u0000-\u001f\ud800-\udfff]*$", 4096, "an absolute path")
ENV_NAME = StringRule(r"^[A-Za-z_][A-Za-z0-9_]*$", 255, "a variable name: letters, digits, _")
ENV_VALUE = StringRule(r"^[^\u0000\ud800-\udfff]*$", 4096, "text without NUL", min_length=0)


def jobs(request: Request) -> JobController:
    controller: JobController = request.app.state.jobs
    return controller


# ------------------------------------------------------------------ bodies


class TopologyIn(InModel):
    level: TopologyRequirement = Field(
        default=TopologyRequirement.ANY,
        strict=False,
        description=(
            "any; same-node: every member on one node; nvlink: each member's GPUs joined by "
            "NVLink; same-rack: every member in one rack (or NVLink clique)."
        ),
    )
    mode: Mode = Field(
        default=Mode.REQUIRED,
        strict=False,
        description=(
            "required: wait (reason topology) until the level fits; preferred: place at any "
            "when it does not, and record that it relaxed (`topology_relaxed`)."
        ),
    )


class RestartIn(InModel):
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=MAX_RESTARTS,
        description="Failed attempts retried; preemptions never count. 0: no retry.",
    )
    backoff_s: float = Field(
        default=10.0,
        ge=0,
        le=MAX_BACKOFF_S,
        description="Wait before the first restart; doubles for each next one.",
    )
    backoff_cap_s: float = Field(
        default=300.0, ge=0, le=MAX_BACKOFF_S, description="The longest wait; >= backoff_s."
    )
    fail_on_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list,
        max_length=MAX_EXIT_CODES,
        description="Exit codes (1..255) that end the job at once, without a restart.",
    )


class MembersIn(InModel):
    # Ranges are checked by the job itself (policies.elastic.MemberBounds): a failed arm of
    # the union would name its type in the error's field instead of members.min/max.
    min: int = Field(description="The gang it starts with and keeps (1 or more).")
    max: int | None = Field(default=None, description="The most it grows to (min to 1024).")


class JobIn(InModel):
    tenant: Label = Field(description="The tenant charged; the caller must be a member of it.")
    name: Text = Field(description="A name for people.")
    members: int | MembersIn = Field(
        description=(
            f"Processes (ranks, 1 to {MAX_GANG_SIZE}) started all-or-nothing; {{min, max}}: an "
            "elastic job, started at min and grown by one-member slices up to max "
            "(docs/jobs.md)."
        )
    )
    devices: DevicesIn = Field(
        description="What each member needs (its `topology` stays any: see `topology`)."
    )
    topology: TopologyIn = Field(
        default_factory=TopologyIn, description="How tightly the gang must be placed."
    )
    command: list[Annotated[str, ARG]] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="Local backend: the program and its arguments (required there).",
    )
    cwd: Annotated[str, ABSOLUTE_PATH] | None = Field(
        default=None, description="Local backend: working directory; null: the portal's."
    )
    image: Annotated[str, bounded(KEY, 1024)] | None = Field(
        default=None, description="Kubernetes backend: the container image (required there)."
    )
    env: dict[Annotated[str, ENV_NAME], Annotated[str, ENV_VALUE]] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="Extra variables; not the ones the portal sets (docs/training-contract.md).",
    )
    checkpoint_dir: Annotated[str, ABSOLUTE_PATH] | None = Field(
        default=None,
        description=(
            "Where members write checkpoints (GPUPORTAL_CHECKPOINT_DIR); each attempt resumes "
            "from the newest complete one (GPUPORTAL_RESUME_FROM). null: no resume."
        ),
    )
    restart: RestartIn = Field(default_factory=RestartIn, description="Retries and backoff.")
    priority: int = Field(
        default=0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="Higher is scheduled first; within a tenant's quota only.",
    )
    expected_duration_s: float | None = Field(
        default=None, gt=0, le=1e9, description="How long an attempt runs, for queue ETAs."
    )


class AttemptOut(Model):
    number: int = Field(ge=1, description="1 for the first attempt.")
    workload_id: str = Field(description="The attempt's allocator workload.")
    queued_at: datetime
    started_at: datetime | None = Field(description="null until its members were launched.")
    ended_at: datetime | None = Field(description="null while it waits or runs.")
    queue_wait_s: float | None = Field(description="Queued to started; null until started.")
    nodes: list[str] = Field(description="Its nodes, in node-rank order; empty until started.")
    topology: str = Field(description="The level it was placed at (any when relaxed).")
    exit_reason: str = Field(
        description=(
            "'' while it runs; completed, exit code N, node lost, preempted by T reclaim, "
            "backoff limit, cancelled, launch failed: ..."
        )
    )
    exit_code: int | None = Field(description="The failing member's exit code; null if none.")
    counted: bool = Field(description="Whether it used one of the job's restarts.")
    resume_from: str | None = Field(description="The checkpoint it resumed from; null: none.")
    resume_step: int | None = Field(description="That checkpoint's step; null: none.")
    world_size: int | None = Field(
        description="Members it ran with (changes with an elastic job's resizes); null: not yet."
    )


class JobOut(Model):
    id: str
    tenant: str
    owner: str
    name: str
    state: JobState = Field(
        description="queued, running, backoff (waiting to restart), succeeded, failed, cancelled."
    )
    reason: str = Field(
        description="Why it ended: completed, backoff_limit, exit_code, cancelled, launch_failed."
    )
    message: str = Field(description="Where it stands, as a sentence.")
    members: int = Field(ge=1, description="Fixed jobs: the gang; elastic jobs: min.")
    max_members: int | None = Field(description="Elastic jobs: the most members; null: fixed.")
    members_now: int = Field(ge=1, description="Members of the current (or last) attempt.")
    attempt: int = Field(ge=0, description="The current (or last) attempt's number.")
    restarts: int = Field(ge=0, description="Attempts counted against max_restarts.")
    preemptions: int = Field(ge=0, description="Attempts stopped by a preemption (not counted).")
    topology_relaxed: bool = Field(description="The current attempt runs at any (preferred).")
    created_at: datetime
    updated_at: datetime
    next_start_at: datetime | None = Field(description="In backoff: when it is requeued.")
    ended_at: datetime | None = Field(description="null until it ends.")
    gpu_hours: float = Field(
        ge=0, description="GPU-equivalent hours its attempts held, running ones up to now."
    )
    spec: dict[str, Any] = Field(description="The job as submitted (defaults filled in).")
    workload: WorkloadOut | None = Field(
        description=(
            "The current attempt's workload: queue reason, position and ETA while it waits, "
            "allocations while it runs; null in backoff before the next attempt."
        )
    )


class AttemptCostOut(Model):
    number: int = Field(ge=1, description="The attempt.")
    workload_id: str = Field(description="Its allocator workload, whose allocations are priced.")
    exit_reason: str = Field(description="As in the attempt history ('' while it runs).")
    gpu_hours: float = Field(ge=0, description="GPU-equivalent hours it held (running: to now).")
    cost: str = Field(pattern=MONEY, description="In `currency`, whole cents.")


class SliceCostOut(Model):
    workload_id: str = Field(description="An elastic job's slice: one member beyond `min`.")
    gpu_hours: float = Field(ge=0, description="GPU-equivalent hours it held (running: to now).")
    cost: str = Field(pattern=MONEY, description="In `currency`, whole cents.")


class JobCostOut(Model):
    job_id: str
    tenant: str = Field(description="The tenant charged.")
    currency: str
    unpriced_models: list[str] = Field(
        description="GPU models the job held without a configured price; counted at 0."
    )
    gpu_hours: float = Field(ge=0, description="Every attempt and slice together.")
    cost: str = Field(
        pattern=MONEY,
        description=(
            "Every attempt and slice together, rounded once from the exact sum (whole cents)."
        ),
    )
    attempts: list[AttemptCostOut] = Field(
        description=(
            "Oldest first. Time waiting in the queue costs nothing; time holding devices "
            "does, preempted attempts' included (until their members ended)."
        )
    )
    slices: list[SliceCostOut] = Field(
        default_factory=list,
        description="An elastic job's slices, released ones included, by workload id.",
    )


def cost_answer(
    acc: Accounting,
    job_id: str,
    tenant: str,
    attempts: Sequence[tuple[int, str, str]],
    slices: Sequence[str] = (),
) -> JobCostOut:
    """A job's cost answer, training or Ray: `attempts` as (number, workload id, exit
    reason), `slices` the workloads it held beyond them; the total counts each workload once."""
    costs = workload_costs(acc, [w for _, w, _ in attempts] + list(slices))
    total = costs.total()

    def gpu_hours(w: str) -> float:
        return float(costs.of(w).allocated_gpu_hours)

    def cost(w: str) -> str:
        return money_text(costs.of(w).cost)

    return JobCostOut(
        job_id=job_id,
        tenant=tenant,
        currency=costs.currency,
        unpriced_models=list(costs.unpriced_models),
        gpu_hours=float(total.allocated_gpu_hours),
        cost=money_text(total.cost),
        attempts=[
            AttemptCostOut(
                number=n, workload_id=w, exit_reason=r, gpu_hours=gpu_hours(w), cost=cost(w)
            )
            for n, w, r in attempts
        ],
        slices=[SliceCostOut(workload_id=w, gpu_hours=gpu_hours(w), cost=cost(w)) for w in slices],
    )


class LogOut(Model):
    job_id: str
    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    offset: int = Field(ge=0, description="Byte offset of `text` in the log.")
    next_offset: int = Field(ge=0, description="Pass it as `offset` to read what follows.")
    text: str = Field(description="The bytes read, decoded as UTF-8 (invalid bytes replaced).")
    done: bool = Field(description="The attempt ended and everything was read: stop following.")
    unavailable: str = Field(
        default="",
        description=(
            "Why there is no log to read ('' when there is): e.g. the pod's node serves no "
            "logs, or the attempt's pods are gone."
        ),
    )


def job_out(v: JobView, controller: JobController) -> JobOut:
    j = v.job
    most = j.spec.get("max_members")
    return JobOut(
        id=j.id,
        tenant=j.tenant,
        owner=j.owner,
        name=j.name,
        state=j.state,
        reason=j.reason,
        message=j.message,
        members=int(j.spec["members"]),  # type: ignore[call-overload]
        max_members=most if isinstance(most, int) else None,
        members_now=controller.elastic.world(j),
        attempt=j.attempt,
        restarts=j.restarts,
        preemptions=j.preemptions,
        topology_relaxed=j.topology_relaxed,
        created_at=j.created_at,
        updated_at=j.updated_at,
        next_start_at=j.next_start_at,
        ended_at=j.ended_at,
        gpu_hours=controller.gpu_hours(j.id),
        spec=j.spec,
        workload=convert.workload_out(v.workload) if v.workload is not None else None,
    )


def attempt_out(a: AttemptRecord) -> AttemptOut:
    # Same field names: read as attributes, as portal/api/convert.py does.
    return AttemptOut.model_validate(a, from_attributes=True)


def spec_of(body: JobIn, owner: str) -> JobSpec:
    """The job a body describes; rules across fields raise ``InvalidRequest`` naming one."""
    if body.devices.topology is not TopologyRequirement.ANY:
        raise InvalidRequest(
            "devices.topology",
            body.devices.topology.value,
            "any: set the job's topology in topology.level",
        )
    devices = device_request(
        {**body.devices.model_dump(mode="json"), "topology": body.topology.level.value}
    )
    r = body.restart
    if isinstance(body.members, MembersIn) and body.members.max is None:
        raise InvalidRequest("members.max", "missing", "the most members, from members.min")
    return JobSpec(
        tenant=body.tenant,
        owner=owner,
        name=body.name,
        members=body.members if isinstance(body.members, int) else body.members.min,
        max_members=None if isinstance(body.members, int) else body.members.max,
        devices=devices,
        topology_mode=body.topology.mode,
        command=tuple(body.command),
        cwd=body.cwd,
        image=body.image,
        env=tuple(sorted(body.env.items())),
        checkpoint_dir=body.checkpoint_dir,
        restart=RestartPolicy(
            max_restarts=r.max_restarts,
            backoff_s=r.backoff_s,
            backoff_cap_s=r.backoff_cap_s,
            fail_on_exit_codes=frozenset(r.fail_on_exit_codes),
        ),
        priority=body.priority,
        expected_duration_s=body.expected_duration_s,
    )


# ------------------------------------------------------------------ routes


@router.post("", response_model=JobOut, status_code=201, responses=_404, summary="Submit a job")
def submit_job(
    body: JobIn,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    controller: Annotated[JobController, Depends(jobs)],
) -> JobOut:
    """Created with its first attempt requested: see `workload` for its queue reason,
    position and ETA, or its allocations when it was placed at once."""
    charge(caller, body.tenant)
    view = controller.submit(spec_of(body, caller.name))
    return job_out(view, controller)


@router.get(
    "",
    response_model=Page[JobOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="List jobs",
)
def list_jobs(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    controller: Annotated[JobController, Depends(jobs)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    state: Annotated[JobState | None, Query(description="Only this state.")] = None,
) -> Page[JobOut]:
    """Every job the caller may see, in submission order, ended ones included."""
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    views = [v for v in controller.jobs(shown) if state is None or v.job.state is state]
    return page.page_of(views, lambda v: job_out(v, controller))


def _readable(caller: Caller, controller: JobController, job_id: str) -> JobView:
    view = controller.view(job_id)
    caller.require(Scope.WORKLOADS_READ, view.job.tenant)
    return view


@router.get("/{job_id}", response_model=JobOut, responses=_404, summary="Read one")
def get_job(
    job_id: JobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[JobController, Depends(jobs)],
) -> JobOut:
    return job_out(_readable(caller, controller, job_id), controller)


@router.delete(
    "/{job_id}",
    response_model=JobOut,
    responses=_404,
    summary="Cancel: stop its members and release its devices (idempotent)",
)
def cancel_job(
    job_id: JobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    controller: Annotated[JobController, Depends(jobs)],
) -> JobOut:
    charge(caller, controller.get(job_id).tenant)
    return job_out(controller.cancel(job_id), controller)


@router.get(
    "/{job_id}/attempts",
    response_model=Page[AttemptOut],
    responses=_404,
    summary="Its attempts, oldest first (paged: preemptions are not bounded by max_restarts)",
)
def job_attempts(
    job_id: JobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[JobController, Depends(jobs)],
    page: Annotated[Paging, Depends(paging)],
) -> Page[AttemptOut]:
    _readable(caller, controller, job_id)
    return page.page_of(controller.attempts(job_id), attempt_out)


@router.get(
    "/{job_id}/cost",
    response_model=JobCostOut,
    responses=_404,
    summary="GPU-hours and money of the job and of each attempt, priced as /cost prices",
)
def job_cost(
    job_id: JobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[JobController, Depends(jobs)],
    acc: Annotated[Accounting, Depends(accounting_of)],
) -> JobCostOut:
    """Whoever may read the job may read what it cost; the tenant's totals stay behind
    `cost:read` (`/cost`)."""
    job = _readable(caller, controller, job_id).job
    attempts = controller.attempts(job_id)
    held = stored_jobs.workload_ids(acc.store, job)
    gang = {a.workload_id for a in attempts}
    return cost_answer(
        acc,
        job_id,
        job.tenant,
        [(a.number, a.workload_id, a.exit_reason) for a in attempts],
        slices=[w for w in held if w not in gang],
    )


@router.get(
    "/{job_id}/logs",
    response_model=LogOut,
    responses=_404,
    summary="A member's log from a byte offset (follow by polling with next_offset)",
)
def job_logs(
    job_id: JobId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[JobController, Depends(jobs)],
    attempt: Annotated[
        int | None, Query(ge=1, le=1_000_000, description="Default: the current attempt.")
    ] = None,
    rank: Annotated[int, Query(ge=0, le=MAX_GANG_SIZE - 1, description="The member.")] = 0,
    offset: Annotated[int, Query(ge=0, le=1 << 50, description="Bytes to skip.")] = 0,
    limit: Annotated[
        int,
        Query(ge=1, le=MAX_LOG_BYTES, description=f"At most this many bytes (<= {MAX_LOG_BYTES})."),
    ] = 65536,
) -> LogOut:
    view = _readable(caller, controller, job_id)
    job = view.job
    number = attempt or max(1, job.attempt)
    # An elastic job's attempts ran up to max_members ranks.
    members = int(job.spec.get("max_members") or job.spec["members"])  # type: ignore[call-overload]
    if number > max(1, job.attempt):
        raise InvalidRequest("attempt", number, f"1 to {max(1, job.attempt)}")
    if rank >= members:
        raise InvalidRequest("rank", rank, f"0 to {members - 1}")
    ended = job.state.terminal or number < job.attempt
    chunk = controller.read_log(job_id, number, rank, offset, limit)
    data, size = chunk.data, chunk.size
    return LogOut(
        job_id=job_id,
        attempt=number,
        rank=rank,
        offset=offset,
        next_offset=offset + len(data),
        text=data.decode("utf-8", errors="replace"),
        done=ended and offset + len(data) >= size,
        unavailable=chunk.unavailable,
    )
