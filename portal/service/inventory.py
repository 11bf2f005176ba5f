"""The service's inventory: which source the ``inventory`` setting names, and a follower
thread that applies the source's changes to the allocator.

Setting values: ``demo``, ``preset:NAME=COUNT[,NAME=COUNT]``, ``file:PATH``, ``kubernetes``,
``nvml``. A source's ``watch()`` is async (the Kubernetes one needs an event loop for its
client); the follower runs it on an event loop of its own in one background thread, so the
server's loop never waits on the apiserver and the allocator's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from policies.errors import InvalidRequest, PortalError
from policies.inventory import Node
from portal.allocator import Allocator
from portal.allocator.inventory_sync import apply_event
from portal.errors import Unavailable
from portal.inventory.events import InventorySource
from portal.inventory.presets import PRESETS
from portal.inventory.simulated import SimulatedInventory, generate

log = logging.getLogger(__name__)

SETTING = "GPUPORTAL_INVENTORY"
FORMS = "demo, preset:NAME=COUNT[,NAME=COUNT], file:PATH, kubernetes or nvml"
RETRY_S = 5.0
"""Pause before watching again after a source's watch failed."""

SourceFactory = Callable[[], InventorySource]


def source_factory(spec: str) -> SourceFactory:
    """What builds the source ``spec`` names; checks the spec's form now, builds later (in the
    follower's thread, where an async client may be created).

    Raises:
        InvalidRequest: ``spec`` is none of the valid forms, or names an unknown preset.
    """
    kind, _, arg = spec.strip().partition(":")
    if kind == "demo" and not arg:
        return SimulatedInventory.demo
    if kind == "preset" and arg:
        counts = _preset_counts(arg)
        return lambda: SimulatedInventory(generate(counts))
    if kind == "file" and arg:
        path = Path(arg).expanduser().resolve()
        if not path.is_file():
            raise InvalidRequest(SETTING, repr(spec), f"file:PATH of an existing file ({path})")
        return lambda: SimulatedInventory.from_file(path)
    if kind == "kubernetes" and not arg:
        return _kubernetes
    if kind == "nvml" and not arg:
        return _nvml
    raise InvalidRequest(SETTING, repr(spec), FORMS)


def _preset_counts(arg: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in arg.split(","):
        name, _, raw = part.strip().partition("=")
        if name not in PRESETS:
            raise InvalidRequest(f"{SETTING} preset", repr(name), "one of " + ", ".join(PRESETS))
        if not raw.isdigit() or int(raw) < 1:
            raise InvalidRequest(f"{SETTING} count of {name}", repr(raw), "an integer >= 1")
        counts[name] = int(raw)
    return counts


def _nvml() -> InventorySource:
    from portal.inventory import nvml

    return SimulatedInventory([nvml.discover()])


def _kubernetes() -> InventorySource:
    # In the cluster: the pod's service account; outside it: the kubeconfig.
    import kubernetes
    import kubernetes_asyncio
    from kubernetes.config.config_exception import ConfigException

    from portal.inventory.kubernetes import KubernetesInventory

    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        kubernetes_asyncio.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException:
        kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
        asyncio.get_event_loop().run_until_complete(kubernetes_asyncio.config.load_kube_config())

    async def build() -> InventorySource:
        # aiohttp binds the async client to the running loop: create it on the follower's.
        return KubernetesInventory(
            kubernetes_asyncio.client.CoreV1Api(), core_v1=kubernetes.client.CoreV1Api()
        )

    return asyncio.get_event_loop().run_until_complete(build())


class Follower:
    """Owns an inventory source in one thread: ``start`` returns its snapshot, ``follow``
    applies its changes to an allocator from then on, ``stop`` ends the thread."""

    def __init__(self, make_source: SourceFactory, description: str = "inventory") -> None:
        self._make = make_source
        self._description = description
        self._loop: asyncio.AbstractEventLoop | None = None
        self._snapshot: list[Node] | None = None
        self._failure: BaseException | None = None
        self._ready = threading.Event()
        self._go = threading.Event()
        self._stopping = threading.Event()
        self._allocator: Allocator | None = None
        self._task: asyncio.Task[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="inventory", daemon=True)
        self.errors = 0

    def start(self, timeout_s: float = 120.0) -> list[Node]:
        """Build the source and take its snapshot (in the follower's thread).

        Raises:
            PortalError: the source could not be built or listed (e.g. no NVIDIA driver);
                ``Unavailable`` for failures outside the portal's own errors (no kubeconfig,
                an apiserver that does not answer) and for no snapshot within ``timeout_s``.
        """
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise Unavailable(f"{self._description}: no snapshot in {timeout_s:g} s")
        failure = self._failure
        if isinstance(failure, PortalError):
            raise failure
        if failure is not None:
            reason = f"{type(failure).__name__}: {failure}".strip().splitlines()[0]
            raise Unavailable(f"{self._description} could not be listed: {reason}") from failure
        assert self._snapshot is not None
        return self._snapshot

    def follow(self, allocator: Allocator) -> None:
        """Apply changes after the snapshot to ``allocator`` (which started on the snapshot)."""
        self._allocator = allocator
        self._go.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._go.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            # The loop closes when the watch ended by itself (a source that never changes).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            try:
                source = self._make()
                self._snapshot = source.snapshot()
            except BaseException as exc:
                self._failure = exc
                return
            finally:
                self._ready.set()
            self._go.wait()
            if self._stopping.is_set():
                return
            self._task = loop.create_task(self._watch(source))
            if self._stopping.is_set():  # stop() ran before the task existed
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(self._task)
        finally:
            loop.close()

    async def _watch(self, source: InventorySource) -> None:
        assert self._allocator is not None
        while not self._stopping.is_set():
            try:
                async for event in source.watch():
                    apply_event(self._allocator, event)
                return  # a source that never changes ends its watch
            except asyncio.CancelledError:
                raise
            except Exception:
                self.errors += 1
                log.exception("inventory watch failed; watching again in %g s", RETRY_S)
                await asyncio.sleep(RETRY_S)
