"""The environment every member of a training job starts with: who it is in the gang, where the
gang meets, and where it checkpoints.

The variables are the ones ``torchrun`` and ``torch.distributed`` read (``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NNODES``,
``NODE_RANK``, ``TORCHELASTIC_RUN_ID``), which other launchers (JAX's
``jax.distributed.initialize``, Horovod, DeepSpeed) take as arguments, plus the portal's own
``GPUPORTAL_*`` variables of the checkpoint contract (``docs/training-contract.md``). One member
is one rank; ranks are laid out contiguously per node (node 0 holds ranks 0..k-1, node 1 the
next block, ...), which is what ``LOCAL_RANK`` and ``NODE_RANK`` assume.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.errors import InvalidRequest

__all__ = ["RENDEZVOUS_VARIABLES", "rendezvous_env"]

# Every variable rendezvous_env sets, each in every member's environment.
RENDEZVOUS_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NNODES",
    "NODE_RANK",
    "TORCHELASTIC_RUN_ID",
    "GPUPORTAL_JOB_ID",
    "GPUPORTAL_ATTEMPT",
    "GPUPORTAL_CHECKPOINT_DIR",
    "GPUPORTAL_RESUME_FROM",
)


def rendezvous_env(
    job_id: str,
    attempt: int,
    members: Sequence[tuple[int, str]],
    master_addr: str,
    master_port: int,
    checkpoint_dir: str | None,
    resume_from: str | None,
) -> list[dict[str, str]]:
    """One environment per rank, in rank order.

    ``members`` are ``(rank, node)`` pairs in rank order: ranks ``0..n-1``, each node's ranks in
    one contiguous block. ``checkpoint_dir`` and ``resume_from`` of ``None`` become empty
    variables (set, so a value from the portal's own environment can never leak through): a
    script reads an empty ``GPUPORTAL_RESUME_FROM`` as "start from scratch". Raises
    ``InvalidRequest`` naming the bad value, and builds nothing, on a layout that is not
    contiguous per node, ranks out of order, an empty job id, an attempt below 1 or a port out
    of range.
    """
    if not job_id:
        raise InvalidRequest("job_id", repr(job_id), "a non-empty job id")
    if attempt < 1:
        raise InvalidRequest("attempt", attempt, "an attempt number of 1 or more")
    if not master_addr:
        raise InvalidRequest("master_addr", repr(master_addr), "a host name or address")
    if not 1 <= master_port <= 65535:
        raise InvalidRequest("master_port", master_port, "a TCP port from 1 to 65535")
    if not members:
        raise InvalidRequest("members", "[]", "at least one (rank, node) pair")
    blocks = _node_blocks(members)
    shared = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(len(members)),
        "NNODES": str(len(blocks)),
        "TORCHELASTIC_RUN_ID": job_id,
        "GPUPORTAL_JOB_ID": job_id,
        "GPUPORTAL_ATTEMPT": str(attempt),
        "GPUPORTAL_CHECKPOINT_DIR": checkpoint_dir or "",
        "GPUPORTAL_RESUME_FROM": resume_from or "",
    }
    envs: list[dict[str, str]] = []
    for node_rank, (first, size) in enumerate(blocks):
        for local_rank in range(size):
            envs.append(
                {
                    **shared,
                    "RANK": str(first + local_rank),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(size),
                    "NODE_RANK": str(node_rank),
                }
            )
    return envs


def _node_blocks(members: Sequence[tuple[int, str]]) -> list[tuple[int, int]]:
    """``(first rank, size)`` of each node's block, in node order; raises on a bad layout."""
    blocks: list[tuple[int, int]] = []
    seen: dict[str, int] = {}  # node -> the rank that opened its block
    previous: str | None = None
    for position, (rank, node) in enumerate(members):
        if rank != position:
            raise InvalidRequest(
                "members",
                f"rank {rank} at position {position}",
                f"rank {position} (ranks 0..n-1 in order)",
            )
        if not node:
            raise InvalidRequest("members", f"rank {rank} on node {node!r}", "a node name")
        if node == previous:
            first, size = blocks[-1]
            blocks[-1] = (first, size + 1)
            continue
        if node in seen:
            raise InvalidRequest(
                "members",
                f"rank {rank} on node {node!r} (its ranks began at {seen[node]}, then another "
                f"node's came between)",
                "each node's ranks in one contiguous block",
            )
        seen[node] = rank
        blocks.append((rank, 1))
        previous = node
    return blocks
