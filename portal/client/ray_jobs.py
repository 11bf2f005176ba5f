"""Ray jobs from Python: ``Portal().ray.submit(...)`` runs an entrypoint on a tenant's Ray
cluster, or on a one-off cluster of its own that is deleted when the job ends.

::

    job = Portal().ray.submit("python train.py", cluster_id=c.id,
                              working_dir="/home/alice/rl", env_vars={"EPOCHS": "3"})
    job = Portal().ray.submit("python train.py", tenant="team-a", workers=2,
                              flavor="H100-80GB")          # one-off
    Portal().ray.wait_job(job.id)                           # succeeded, failed or cancelled
    print(Portal().ray.job_logs(job.id).text)

The operations are built as the other client calls are (``portal.client.core``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from portal.client import core
from portal.client.core import API, Call, Op, _filters, _seg

if TYPE_CHECKING:
    from portal.api.jobs import JobCostOut, LogOut
    from portal.api.ray_jobs import RayJobOut


def submit(cluster_id: str | None, body: Mapping[str, Any]) -> Op[RayJobOut]:
    """To ``cluster_id``, or (None) as a one-off job whose body carries its ``cluster``."""
    from portal.api.ray_jobs import RayJobOut

    path = f"{API}/ray/jobs" if cluster_id is None else f"{API}/ray/{_seg(cluster_id)}/jobs"
    # Not retried: a lost answer may have queued the job (and created its cluster).
    return (yield from core.one(Call("POST", path, body=dict(body)), RayJobOut))


def get(job_id: str) -> Op[RayJobOut]:
    from portal.api.ray_jobs import RayJobOut

    call = Call("GET", f"{API}/ray/jobs/{_seg(job_id)}", idempotent=True)
    return (yield from core.one(call, RayJobOut))


def listed(page_size: int, tenant: str | None, cluster_id: str | None) -> Op[list[RayJobOut]]:
    from portal.api.ray_jobs import RayJobOut

    if cluster_id is not None:
        path = f"{API}/ray/{_seg(cluster_id)}/jobs"
        return (yield from core.every_page(path, RayJobOut, page_size))
    params = _filters(tenant=tenant)
    return (yield from core.every_page(f"{API}/ray/jobs", RayJobOut, page_size, params))


def stop(job_id: str) -> Op[RayJobOut]:
    from portal.api.ray_jobs import RayJobOut

    call = Call("DELETE", f"{API}/ray/jobs/{_seg(job_id)}", idempotent=True)
    return (yield from core.one(call, RayJobOut))


def logs(job_id: str, attempt: int | None, offset: int) -> Op[LogOut]:
    from portal.api.jobs import LogOut

    params = _filters(attempt=attempt, offset=offset)
    call = Call("GET", f"{API}/ray/jobs/{_seg(job_id)}/logs", params, idempotent=True)
    return (yield from core.one(call, LogOut))


def cost(job_id: str) -> Op[JobCostOut]:
    from portal.api.jobs import JobCostOut

    call = Call("GET", f"{API}/ray/jobs/{_seg(job_id)}/cost", idempotent=True)
    return (yield from core.one(call, JobCostOut))


def body(
    entrypoint: str,
    *,
    working_dir: str | None,
    env_vars: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    cluster: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The body of a submission; the server checks every value and names the one wrong."""
    sent: dict[str, Any] = {
        "entrypoint": entrypoint,
        "runtime_env": {"working_dir": working_dir, "env_vars": dict(env_vars or {})},
        "metadata": dict(metadata or {}),
    }
    if cluster is not None:
        sent["cluster"] = dict(cluster)
    return sent
