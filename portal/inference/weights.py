"""The weight cache of the local backend: one copy of a model per node, content-addressed by
its digest (``portal.inference.digest``), fetched once from the model's URI and given to every
replica on that node read-only.

An entry lives at ``<root>/<node>/<hex digest>/``. A fetch goes to a temporary folder beside
it, is digested, and only a matching copy is made read-only (files 0444, folders 0555) and
renamed into place, so a replica never sees a partial or mismatched copy: a mismatch deletes
the temporary folder. One lock per (node, digest) makes replicas that start together wait for
the one fetch. Beside each entry, ``<hex digest>.json`` holds its size and, per tenant that
used it, when it last did: an entry counts in full against each such tenant's cap
(``tenant_bytes``) and once against the node's (``node_bytes``). Room is made by evicting the
least recently used entries that no running replica uses; what cannot be made room for is
refused with the sizes that stand in the way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

import httpx

from policies.errors import Conflict, InvalidRequest, Unavailable
from policies.services import ModelRef
from policies.weightcache import Held, make_room, no_room
from portal.inference.digest import PREFIX, folder_digest, folder_size

FETCHABLE = ("file", "http", "https")
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
CHUNK = 1 << 20
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")

InUse = Collection[tuple[str, str]]
"""(node, digest) pairs that a replica with a process uses: never evicted."""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One tenant's use of one cached model on one node."""

    node: str
    tenant: str
    digest: str
    size: int
    last_used: datetime
    in_use: bool


@dataclass(slots=True)
class _Meta:
    """An entry's record: its bytes, and per tenant when it last used it (ISO time)."""

    size: int
    tenants: dict[str, str]


@dataclass(frozen=True, slots=True)
class Fetched:
    """Where a replica finds its weights, and whether this call fetched them (a cold start)."""

    path: Path
    fetched_bytes: int
    ready: bool = True
    """False while the weights are being fetched elsewhere (a fetch pod on Kubernetes): the
    replica waits, holding its devices, and asks again."""
    waited: bool = False
    """The replica waited for a fetch (Kubernetes, where the pod knows the bytes, not us)."""

    @property
    def cold(self) -> bool:
        return self.fetched_bytes > 0 or self.waited


class Weights(Protocol):
    """What the service controller uses of a weight cache: ``WeightCache`` here,
    ``portal.inference.kubecache.KubeWeights`` on Kubernetes."""

    per_tenant: bool
    """Each tenant has copies of its own (a node's entry serves only its tenant)."""

    def caches(self, uri: str) -> bool:
        """Whether a model at ``uri`` goes through the cache (else the engine gets the URI)."""
        ...

    def ensure(
        self, node: str, tenant: str, model: ModelRef, in_use: InUse, now: datetime
    ) -> Fetched: ...

    def entries(
        self, in_use: InUse, tenants: Collection[str] | None = None
    ) -> list[CacheEntry]: ...


def check_fetchable(uri: str) -> None:
    """The local backend fetches ``file://``, ``http://`` and ``https://`` models."""
    if urlsplit(uri).scheme not in FETCHABLE:
        raise InvalidRequest(
            "model.uri", uri, "a file://, http:// or https:// URI on the local backend"
        )


class WeightCache:
    """The cache under ``root``. Thread-safe; its state is its folders, so a restarted portal
    finds what it had."""

    per_tenant = False

    def __init__(self, root: Path, *, node_bytes: int, tenant_bytes: int) -> None:
        if node_bytes < 1 or not 1 <= tenant_bytes <= node_bytes:
            raise InvalidRequest(
                "weight cache sizes",
                f"node {node_bytes}, tenant {tenant_bytes}",
                "1 <= tenant bytes <= node bytes",
            )
        self.root = root
        self.node_bytes = node_bytes
        self.tenant_bytes = tenant_bytes
        self._meta_lock = threading.Lock()  # every .json and every eviction
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        root.mkdir(parents=True, exist_ok=True, mode=0o755)

    # ---------------------------------------------------------------- a replica's weights

    def caches(self, uri: str) -> bool:
        return urlsplit(uri).scheme in FETCHABLE

    def ensure(
        self, node: str, tenant: str, model: ModelRef, in_use: InUse, now: datetime
    ) -> Fetched:
        """The read-only folder of ``model`` on ``node`` for ``tenant``: fetched and checked
        if not yet cached there, room made by evicting unused entries.

        Raises:
            InvalidRequest: the URI cannot be fetched here, or its files do not match the
                digest (nothing is kept).
            Conflict: the tenant's or the node's cache cannot make room for it.
            Unavailable: the fetch failed (the source did not answer, or sent an error).
        """
        check_fetchable(model.uri)
        key = (node, model.digest)
        with self._meta_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            entry = self._entry_dir(node, model.digest)
            # Under the meta lock, as evictions are: an entry is there with its record or not.
            with self._meta_lock:
                if self._meta_path(node, model.digest).exists() and entry.is_dir():
                    meta = self._read_meta(node, model.digest)
                    if tenant not in meta.tenants:
                        self._make_room(node, tenant, meta.size, in_use, model.digest, 0)
                    self._touch(node, model.digest, tenant, now, meta.size)
                    return Fetched(entry, 0)
                self._meta_path(node, model.digest).unlink(missing_ok=True)
                if entry.exists():
                    remove(entry)  # left by a crash in an eviction: no record counts it
            limit = self.tenant_bytes
            tmp = entry.parent / f".fetch-{entry.name}-{uuid.uuid4().hex}"
            tmp.mkdir(parents=True, mode=0o700)
            try:
                fetched = fetch_checked(model, tmp, limit)
                size = folder_size(tmp)
                with self._meta_lock:
                    self._make_room(node, tenant, size, in_use, model.digest, size)
                    read_only(tmp)
                    tmp.rename(entry)
                    self._touch(node, model.digest, tenant, now, size)
            finally:
                if tmp.exists():
                    remove(tmp)
            return Fetched(entry, fetched)

    # ---------------------------------------------------------------- listing

    def entries(self, in_use: InUse, tenants: Collection[str] | None = None) -> list[CacheEntry]:
        """One row per node, tenant and digest (only ``tenants``' rows when given)."""
        rows: list[CacheEntry] = []
        used = set(in_use)
        with self._meta_lock:
            for node, digest in self._all():
                meta = self._read_meta(node, digest)
                for tenant, at in sorted(meta.tenants.items()):
                    if tenants is None or tenant in tenants:
                        rows.append(
                            CacheEntry(node, tenant, digest, meta.size,
                                       datetime.fromisoformat(at), (node, digest) in used)
                        )  # fmt: skip
        return rows

    # ---------------------------------------------------------------- accounting

    def _make_room(
        self, node: str, tenant: str, size: int, in_use: InUse, digest: str, new: int
    ) -> None:
        """Evict until ``tenant`` can be charged ``size`` more and the node hold ``new`` more
        bytes (0 when the entry is already there); called under the meta lock. Which entries
        go is ``policies.weightcache.make_room``'s decision, for the tenant's cap then the
        node's; here it is only carried out."""
        used = set(in_use) | {(node, digest)}
        held = {d: self._read_meta(node, d) for n, d in self._all() if n == node}
        mine = [
            Held(d, m.size, datetime.fromisoformat(m.tenants[tenant]), (node, d) in used)
            for d, m in held.items()
            if tenant in m.tenants
        ]
        room = make_room(mine, size, self.tenant_bytes)
        if not room.fits:
            where = f"tenant {tenant} on node {node}"
            remedy = "stop a service of that tenant or raise GPUPORTAL_WEIGHT_CACHE_TENANT_BYTES"
            raise no_room(where, size, room, self.tenant_bytes, remedy)
        for d in room.evict:
            del held[d].tenants[tenant]
            self._drop_tenant(node, d, tenant)
            if not held[d].tenants:
                del held[d]
        every = [
            Held(d, m.size, max(map(datetime.fromisoformat, m.tenants.values())),
                 (node, d) in used)
            for d, m in held.items()
            if m.tenants
        ]  # fmt: skip
        room = make_room(every, new, self.node_bytes)
        if not room.fits:
            raise no_room(f"node {node}", new, room, self.node_bytes,
                          "raise GPUPORTAL_WEIGHT_CACHE_BYTES")  # fmt: skip
        for d in room.evict:
            self._evict(node, d)

    def _all(self) -> Iterator[tuple[str, str]]:
        for meta in sorted(self.root.glob("*/*.json")):
            yield _node_of(meta.parent.name), PREFIX + meta.stem

    def _entry_dir(self, node: str, digest: str) -> Path:
        return self.root / _node_dir(node) / digest.removeprefix(PREFIX)

    def _meta_path(self, node: str, digest: str) -> Path:
        return self._entry_dir(node, digest).with_suffix(".json")

    def _read_meta(self, node: str, digest: str) -> _Meta:
        path = self._meta_path(node, digest)
        raw = json.loads(path.read_text()) if path.exists() else {}
        return _Meta(
            int(raw.get("size", 0)), {str(k): str(v) for k, v in raw.get("tenants", {}).items()}
        )

    def _write_meta(self, node: str, digest: str, meta: _Meta) -> None:
        path = self._meta_path(node, digest)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"size": meta.size, "tenants": meta.tenants}, sort_keys=True))
        tmp.replace(path)  # atomic: a crash leaves the old or the new record

    def _touch(self, node: str, digest: str, tenant: str, now: datetime, size: int) -> None:
        meta = self._read_meta(node, digest)
        meta.tenants[tenant] = now.isoformat()
        self._write_meta(node, digest, _Meta(size, meta.tenants))

    def _drop_tenant(self, node: str, digest: str, tenant: str) -> None:
        meta = self._read_meta(node, digest)
        meta.tenants.pop(tenant, None)
        if meta.tenants:
            self._write_meta(node, digest, meta)
        else:
            self._evict(node, digest)

    def _evict(self, node: str, digest: str) -> None:
        # The record goes first: a crash between the two leaves files no record counts, which
        # the next fetch of that digest replaces.
        self._meta_path(node, digest).unlink(missing_ok=True)
        entry = self._entry_dir(node, digest)
        if entry.exists():
            remove(entry)


# -------------------------------------------------------------------- fetching


class DigestMismatch(InvalidRequest):
    """The fetched files are not the model the digest names: refused, never mounted."""


def fetch_checked(model: ModelRef, into: Path, limit: int) -> int:
    """Fetch ``model`` into the empty folder ``into`` and check its digest; the bytes read.
    Used by this cache and by the Kubernetes fetch pods (``portal.inference.fetch``).

    Raises:
        DigestMismatch: the files are not the ones ``model.digest`` names.
        InvalidRequest, Conflict, Unavailable: as ``_fetch``.
    """
    fetched = _fetch(model.uri, into, limit)
    actual = folder_digest(into)
    if actual != model.digest:
        raise DigestMismatch(
            "model.digest",
            model.digest,
            f"the digest of the files at {model.uri}, which is {actual}: "
            "refused, nothing was cached or mounted",
        )
    return fetched


def _fetch(uri: str, into: Path, limit: int) -> int:
    """Copy or download the model at ``uri`` into the empty folder ``into``; the bytes read.
    More than ``limit`` bytes is refused before (or while) they are read."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        src = Path(unquote(parts.path))
        if not src.exists():
            raise InvalidRequest("model.uri", uri, "a file or folder that exists on this host")
        size = folder_size(src) if src.is_dir() else src.stat().st_size
        _check_limit(uri, size, limit)
        if src.is_dir():
            shutil.copytree(src, into, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copyfile(src, into / src.name)
        return size
    name = unquote(parts.path.rstrip("/").rsplit("/", 1)[-1])
    if not SAFE_NAME.fullmatch(name):
        raise InvalidRequest("model.uri", uri, "a URL whose last path segment is a file name")
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    got = 0
    try:
        with httpx.stream("GET", uri, timeout=timeout, follow_redirects=True) as r:
            if r.status_code != 200:
                raise Unavailable(f"fetching {uri}: the server answered {r.status_code}")
            length = r.headers.get("content-length")
            if length is not None and length.isdigit():
                _check_limit(uri, int(length), limit)
            with (into / name).open("wb") as f:
                for chunk in r.iter_bytes(CHUNK):
                    got += len(chunk)
                    _check_limit(uri, got, limit)
                    f.write(chunk)
    except httpx.HTTPError as exc:
        raise Unavailable(f"fetching {uri}: {type(exc).__name__}: {exc}") from None
    return got


def _check_limit(uri: str, size: int, limit: int) -> None:
    if size > limit:
        raise Conflict(
            f"model {uri}: {size} bytes or more, above the {limit} bytes a tenant may cache on "
            "a node (GPUPORTAL_WEIGHT_CACHE_TENANT_BYTES)"
        )


def read_only(folder: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames:
            (Path(dirpath) / name).chmod(0o444)
        for name in dirnames:
            (Path(dirpath) / name).chmod(0o555)
    folder.chmod(0o555)


def remove(folder: Path) -> None:
    """Delete a (read-only) folder: its folders are made writable first."""
    for dirpath, _dirs, _files in os.walk(folder):
        Path(dirpath).chmod(0o700)
    shutil.rmtree(folder)


def _node_dir(node: str) -> str:
    # A node's name is a DNS label in practice; anything else is hex-encoded, never a path.
    return (
        node if SAFE_NAME.fullmatch(node) and node not in (".", "..") else "~" + node.encode().hex()
    )


def _node_of(folder: str) -> str:
    return bytes.fromhex(folder[1:]).decode() if folder.startswith("~") else folder
