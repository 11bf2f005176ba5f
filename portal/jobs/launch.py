"""An attempt's members from the allocator's placement: ranks contiguous per node, each
pinned to its devices, with the rendezvous environment."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from policies.jobs import RankSlot, rank_layout
from portal.jobs.backend import Backend, merged_env
from portal.jobs.rendezvous import rendezvous_env
from portal.jobs.runner import MemberLaunch
from portal.jobs.spec import JobSpec
from portal.store.records import AllocationRecord


def visible_devices(a: AllocationRecord) -> tuple[str, ...]:
    """``CUDA_VISIBLE_DEVICES`` values for one member: a MIG instance by its UUID (CUDA
    names MIG devices only so), whole GPUs and shares by index on their node."""
    if a.mig_profile is not None and a.gpu_uuids:
        return tuple(a.gpu_uuids)
    return tuple(str(g) for g in a.gpus)


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now, for rank 0's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def layout(allocations: Sequence[AllocationRecord]) -> list[tuple[RankSlot, AllocationRecord]]:
    """Each rank with the allocation (member) it runs on."""
    by_member = {a.member: a for a in allocations}
    slots = rank_layout([(a.member, a.node) for a in allocations])
    return [(slot, by_member[slot.member]) for slot in slots]


def nodes_of(allocations: Sequence[AllocationRecord]) -> tuple[str, ...]:
    """The gang's nodes in node-rank order."""
    seen: dict[str, None] = {}
    for slot, _a in layout(allocations):
        seen.setdefault(slot.node, None)
    return tuple(seen)


def member_launches(
    backend: Backend,
    job_id: str,
    attempt: int,
    spec: JobSpec,
    allocations: Sequence[AllocationRecord],
    resume_from: str | None,
    port: int | None = None,
) -> list[MemberLaunch]:
    """One launch per rank, in rank order."""
    placed = layout(allocations)
    if backend.rendezvous is not None:
        addr, port = backend.rendezvous(job_id, attempt)
    else:
        addr = backend.master_addr
        port = port if port is not None else free_port(addr)
    envs = rendezvous_env(
        job_id,
        attempt,
        [(slot.rank, slot.node) for slot, _a in placed],
        addr,
        port,
        spec.checkpoint_dir,
        resume_from,
    )
    user = spec.environment
    return [
        MemberLaunch(
            job_id=job_id,
            attempt=attempt,
            rank=slot.rank,
            node=slot.node,
            devices=visible_devices(a),
            command=spec.command,
            cwd=spec.cwd or ".",
            env=merged_env(user, env),
            image=spec.image,
            tenant=spec.tenant,
            allocation=a,
            kube_job=spec.kube_job,
        )
        for (slot, a), env in zip(placed, envs, strict=True)
    ]
