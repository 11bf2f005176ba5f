"""A local copy of one kind of Kubernetes object, kept current by a watch.

The loops that follow jobs read the same objects again and again; a full list on every round
costs the apiserver and this process in proportion to every object ever created (finished Jobs
and their pods stay until someone deletes them). An ``Informer`` lists once, then follows a
watch from that list's ``resourceVersion`` in a thread of its own, and answers reads from
memory. A watch that expires (410 Gone) or breaks is followed by a fresh list.

What it answers may lag the apiserver by the time an event takes to arrive: a reader that must
not act on an object's absence (a Job just created, a pod just bound) confirms it with a direct
read. Objects are the API's plain JSON (``dict``), as the readers use them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name); the namespace is empty for cluster-scoped objects."""

WATCH_TIMEOUT_S = 60
"""Seconds a watch request stays open before it is renewed (and a stop is noticed at once:
``stop`` closes the connection)."""
RETRY_S = 1.0


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer:
    """Objects of one kind matching ``selectors`` (``label_selector``, ``field_selector``),
    listed by ``list_call`` (a generated client's ``list_*`` method, which also watches).

    ``index`` groups the objects by a key of the caller's (``by``), kept as events arrive, so
    a reader of one group does not scan them all. Thread-safe.
    """

    def __init__(
        self,
        list_call: Callable[..., Any],
        *,
        name: str,
        index: Callable[[Mapping[str, Any]], Hashable | None] | None = None,
        **selectors: str,
    ) -> None:
        self._call = list_call
        self._name = name
        self._index_of = index
        self._selectors = selectors
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._groups: dict[Hashable, dict[Key, dict[str, Any]]] = {}
        self._version: str | None = None
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """List (in the caller's thread: an unreachable apiserver raises here), then follow."""
        if self._thread is not None:
            return
        self._relist()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self._name}")
        self._thread.daemon = True  # a process that ends without ``stop`` is not held up
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:
            # Unblocks the thread's read; a connection that broke already needs nothing.
            with contextlib.suppress(Exception):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopping.is_set()

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def by(self, group: Hashable) -> list[dict[str, Any]]:
        """The objects whose ``index`` is ``group``."""
        with self._lock:
            return list(self._groups.get(group, {}).values())

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._version is None:
                    self._relist()
                self._follow()
            except Exception as e:  # any break: list again after a pause
                if self._stopping.is_set():
                    return
                log.warning("informer %s: %s; listing again", self._name, e)
                self._version = None
                self._stopping.wait(RETRY_S)

    def _relist(self) -> None:
        response = self._call(_preload_content=False, **self._selectors)
        data = json.loads(response.data or b"{}")
        objects = {key_of(o): o for o in data.get("items") or []}
        with self._lock:
            self._objects = {}
            self._groups = {}
            for k, o in objects.items():
                self._put(k, o)
            self._version = str((data.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self) -> None:
        response = self._call(
            watch=True,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            **self._selectors,
        )
        self._response = response
        try:
            lines: Iterable[str] = iter_resp_lines(response)  # type: ignore[no-untyped-call]
            for line in lines:
                if self._stopping.is_set():
                    return
                if not self._apply(json.loads(line)):
                    return
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; False when the watch must start over from a new list."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            # 410 Gone: the watch began further back than the apiserver keeps; list again.
            log.info("informer %s: watch ended: %s", self._name, obj.get("message"))
            self._version = None
            return False
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        with self._lock:
            if kind == "DELETED":
                self._drop(key_of(obj))
            elif kind in ("ADDED", "MODIFIED"):
                self._put(key_of(obj), obj)
            if version:
                self._version = version
        return True

    def _put(self, k: Key, obj: dict[str, Any]) -> None:
        self._drop(k)
        self._objects[k] = obj
        if self._index_of is not None:
            group = self._index_of(obj)
            if group is not None:
                self._groups.setdefault(group, {})[k] = obj

    def _drop(self, k: Key) -> None:
        old = self._objects.pop(k, None)
        if old is not None and self._index_of is not None:
            group = self._index_of(old)
            members = self._groups.get(group) if group is not None else None
            if members is not None:
                members.pop(k, None)
                if not members:
                    del self._groups[group]
