"""Copy-on-write containers: a decision's working copy of the allocator's indexes.

An overlay reads through to its base and keeps its own writes; the base is never changed.
Building one is O(1) and a decision pays only for what it writes, so every operation can
decide on a working copy and leave the live state alone until its decision is committed.
"""

from __future__ import annotations

from collections.abc import (
    ItemsView,
    Iterator,
    Mapping,
    MutableMapping,
    MutableSet,
    Set,
    ValuesView,
)
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

_GONE = object()


class OverlayDict(MutableMapping[K, V]):
    """``base`` with this overlay's assignments and deletions laid over it."""

    __slots__ = ("_base", "_own")

    def __init__(self, base: Mapping[K, V]) -> None:
        self._base = base
        self._own: dict[K, object] = {}

    def __getitem__(self, key: K) -> V:
        if not self._own:
            return self._base[key]
        got = self._own.get(key, self)
        if got is self:
            return self._base[key]
        if got is _GONE:
            raise KeyError(key)
        return got  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        got = self._own.get(key, self)  # type: ignore[arg-type]
        if got is self:
            return key in self._base
        return got is not _GONE

    def __setitem__(self, key: K, value: V) -> None:
        self._own[key] = value

    def __delitem__(self, key: K) -> None:
        if key not in self:
            raise KeyError(key)
        self._own[key] = _GONE

    def __iter__(self) -> Iterator[K]:
        if not self._own:  # the common case: iterate the base at C speed
            return iter(self._base)
        return iter(self._keys())

    def _keys(self) -> list[K]:
        own, base = self._own, self._base
        keys = [k for k in base if own.get(k) is not _GONE]
        keys.extend(k for k, v in own.items() if v is not _GONE and k not in base)
        return keys

    def __len__(self) -> int:
        if not self._own:
            return len(self._base)
        return len(self._keys())

    def items(self) -> ItemsView[K, V]:
        if not self._own:
            return self._base.items()
        return dict(zip(keys := self._keys(), (self[k] for k in keys), strict=True)).items()

    def values(self) -> ValuesView[V]:
        if not self._own:
            return self._base.values()
        return {k: self[k] for k in self._keys()}.values()

    def rebase(self, base: Mapping[K, V]) -> None:
        """Read through ``base`` from now on: only when ``base`` reads exactly as the old base
        did (the old base, a decided draft, has been applied to ``base``)."""
        self._base = base

    def written(self) -> dict[K, V | None]:
        """What the overlay changed: key -> new value, or None for a deletion."""
        return {k: (None if v is _GONE else v) for k, v in self._own.items()}  # type: ignore[misc]


class OverlaySet(MutableSet[K]):
    """``base`` with this overlay's additions and removals."""

    __slots__ = ("_added", "_base", "_removed")

    def __init__(self, base: Set[K]) -> None:
        self._base = base
        self._added: set[K] = set()
        self._removed: set[K] = set()

    def __contains__(self, key: object) -> bool:
        if key in self._added:
            return True
        return key not in self._removed and key in self._base

    def __iter__(self) -> Iterator[K]:
        for key in self._base:
            if key not in self._removed:
                yield key
        for key in self._added:
            if key not in self._base:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def add(self, value: K) -> None:
        self._removed.discard(value)
        if value not in self._base:
            self._added.add(value)

    def discard(self, value: K) -> None:
        self._added.discard(value)
        if value in self._base:
            self._removed.add(value)

    def rebase(self, base: Set[K]) -> None:
        """As ``OverlayDict.rebase``; additions and removals stay relative to an equal view."""
        self._base = base


class OverlayNested(MutableMapping[K, MutableMapping[str, V]]):
    """A mapping of mappings whose inner mappings are overlays too (created on first use)."""

    __slots__ = ("_base", "_inner")

    def __init__(self, base: Mapping[K, Mapping[str, V]]) -> None:
        self._base = base
        self._inner: dict[K, OverlayDict[str, V]] = {}

    def __getitem__(self, key: K) -> MutableMapping[str, V]:
        got = self._inner.get(key)
        if got is None:
            got = self._inner[key] = OverlayDict(self._base.get(key, {}))
        return got

    def __contains__(self, key: object) -> bool:
        return key in self._inner or key in self._base

    def rebase(self, base: Mapping[K, Mapping[str, V]]) -> None:
        """As ``OverlayDict.rebase``, inner overlays included."""
        self._base = base
        for key, inner in self._inner.items():
            inner.rebase(base.get(key, {}))

    def __setitem__(self, key: K, value: MutableMapping[str, V]) -> None:
        raise TypeError("assign to the inner mapping instead")

    def __delitem__(self, key: K) -> None:
        raise TypeError("inner mappings are never removed")

    def __iter__(self) -> Iterator[K]:
        yield from self._base
        for key in self._inner:
            if key not in self._base:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)
