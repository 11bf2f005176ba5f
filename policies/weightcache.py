"""Which weight-cache entries to evict, with no I/O: the one rule the local cache
(``portal.inference.weights``) and the Kubernetes cache (``portal.inference.kubecache``) both
apply; each then acts its own way (deleting a folder here, running an evict Job on the node
there).

Room for ``size`` more bytes under a ``cap`` is made by evicting the least recently used
entries that no running replica uses, oldest first, and no more than needed. Entries in use
are never chosen: when they alone leave too little room, nothing is evicted at all (evicting
some would free too little and still cost a download later).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from policies.errors import Conflict


@dataclass(frozen=True, slots=True)
class Held:
    """An entry counted against a cap: its bytes, when it was last used, and whether a
    running replica uses it (or it is still being fetched: not evictable either)."""

    digest: str
    size: int
    last_used: datetime
    in_use: bool


@dataclass(frozen=True, slots=True)
class Room:
    """The decision: the digests to evict (least recently used first), whether the new bytes
    fit then, and the bytes of the entries that may not be evicted (in use)."""

    evict: tuple[str, ...]
    fits: bool
    pinned: int


def make_room(held: Iterable[Held], size: int, cap: int) -> Room:
    """Which of ``held`` to evict so that ``size`` more bytes fit under ``cap``.

    When they cannot fit even with every unused entry gone, ``evict`` is empty and ``fits``
    is False: nothing is evicted for a fetch that would be refused anyway."""
    entries = list(held)
    total = sum(e.size for e in entries)
    pinned = sum(e.size for e in entries if e.in_use)
    if total + size <= cap:
        return Room((), True, pinned)
    free = sorted((e for e in entries if not e.in_use), key=lambda e: (e.last_used, e.digest))
    chosen: list[str] = []
    for e in free:
        if total + size <= cap:
            break
        chosen.append(e.digest)
        total -= e.size
    if total + size > cap:
        return Room((), False, pinned)
    return Room(tuple(chosen), True, pinned)


def no_room(where: str, size: int, room: Room, cap: int, remedy: str) -> Conflict:
    """The error for a ``room`` that does not fit: what, where, the sizes and what would help."""
    return Conflict(
        f"weight cache of {where}: {size} bytes do not fit, {room.pinned} bytes of {cap} are "
        f"used by running replicas or being fetched; {remedy}"
    )
