"""Kubernetes Nodes → inventory ``Node``s, and a live inventory source watching them.

A Node is a GPU node when GPU Feature Discovery labelled it (``nvidia.com/gpu.product``,
``nvidia.com/gpu.count``), the device plugin advertises ``nvidia.com/gpu`` or
``nvidia.com/mig-*``, or our node agent annotated it (``gpuportal.io/topology``). Other nodes
are ignored.

What comes from where:

- GPUs, UUIDs, exact MIG layout and topology: the node agent's annotation
  (``portal.inventory.annotation``) when present; it is authoritative.
- Otherwise from GPU Feature Discovery labels: model from ``nvidia.com/gpu.product``, count from
  ``nvidia.com/gpu.count``, memory from ``nvidia.com/gpu.memory`` (MiB). With the ``mixed`` MIG
  strategy the instances counted by ``nvidia.com/mig-<profile>.count`` (or the allocatable
  ``nvidia.com/mig-<profile>``) are packed into a *plausible* valid layout: the labels do not say
  which GPU holds which instance or where, so the real placement may differ. With the ``single``
  strategy every GPU carries the same profile. Topology is then unknown (``Node.topology`` None).
- Host CPU and memory: ``status.allocatable``. Zone: ``topology.kubernetes.io/zone``; rack:
  ``gpuportal.io/rack``; pool: ``gpuportal.io/pool``; NVLink clique: ``nvidia.com/gpu.clique``;
  fractional sharing of whole GPUs: ``gpuportal.io/gpu-sharing=true``; taints and
  ``spec.unschedulable`` as they are.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies import mig
from policies.errors import InvalidRequest
from policies.inventory import GPU, Node, Taint, TaintEffect
from policies.topology import Topology
from portal.inventory import annotation, products, quantity
from portal.inventory.events import EventKind, InventoryEvent, diff

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_MIG_CAPABLE = "nvidia.com/mig.capable"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_MIG_CONFIG = "nvidia.com/mig.config"
LABEL_CLIQUE = "nvidia.com/gpu.clique"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_RACK = "gpuportal.io/rack"
LABEL_POOL = "gpuportal.io/pool"
LABEL_SHARING = "gpuportal.io/gpu-sharing"


@dataclass(frozen=True, slots=True)
class NodeView:
    """The parts of a Kubernetes Node we read, typed; built once at the boundary."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: Mapping[str, str]
    resource_version: str = ""


def view(obj: Any) -> NodeView:
    """A typed view of a ``V1Node`` (either client library) or its plain dict form."""
    if isinstance(obj, Mapping):
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        name = meta.get("name", "")
        raw_taints = [
            (t.get("key"), t.get("value"), t.get("effect")) for t in spec.get("taints") or ()
        ]
        return NodeView(
            name=name,
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            taints=_taints(raw_taints, name),
            unschedulable=bool(spec.get("unschedulable")),
            allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
            resource_version=str(meta.get("resourceVersion") or ""),
        )
    meta, spec, status = obj.metadata, obj.spec, obj.status
    name = meta.name or ""
    raw = [(t.key, t.value, t.effect) for t in (spec.taints if spec and spec.taints else ())]
    return NodeView(
        name=name,
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        taints=_taints(raw, name),
        unschedulable=bool(spec.unschedulable) if spec else False,
        allocatable={
            k: str(v) for k, v in ((status.allocatable if status else None) or {}).items()
        },
        resource_version=str(meta.resource_version or ""),
    )


def _taints(raw: Iterable[tuple[Any, Any, Any]], node: str) -> tuple[Taint, ...]:
    out = []
    for key, value, effect in raw:
        try:
            eff = TaintEffect(effect)
        except ValueError:
            raise InvalidRequest(
                f"node {node} taint {key} effect",
                repr(effect),
                "one of " + ", ".join(e.value for e in TaintEffect),
            ) from None
        out.append(Taint(key=str(key), value=str(value or ""), effect=eff))
    return tuple(out)


def is_gpu_node(v: NodeView) -> bool:
    if LABEL_PRODUCT in v.labels or annotation.ANNOTATION in v.annotations:
        return True
    for key, value in v.allocatable.items():
        if key == GPU_RESOURCE or key.startswith(MIG_RESOURCE_PREFIX):
            try:
                if quantity.count(value) > 0:
                    return True
            except InvalidRequest:
                continue
    return False


def to_node(obj: Any) -> Node | None:
    """Convert a Kubernetes Node; ``None`` for a node without GPUs.

    Raises ``InvalidRequest`` naming the node and the field when the Node cannot be understood.
    """
    v = obj if isinstance(obj, NodeView) else view(obj)
    if not is_gpu_node(v):
        return None
    where = f"node {v.name}"
    gpus: tuple[GPU, ...] | None = None
    topology: Topology | None = None
    text = v.annotations.get(annotation.ANNOTATION)
    if text:
        try:
            report = annotation.decode(text, where=f"{where} annotation {annotation.ANNOTATION}")
        except InvalidRequest as e:
            log.warning("ignoring the topology annotation, using labels: %s", e.message)
        else:
            gpus, topology = report.gpus, report.topology
    sharing = v.labels.get(LABEL_SHARING, "").lower() == "true"
    try:
        if gpus is None:
            gpus = _gpus_from_labels(v, where)
        if sharing:
            gpus = tuple(
                GPU(
                    index=g.index,
                    model=g.model,
                    memory_mib=g.memory_mib,
                    uuid=g.uuid,
                    mig_enabled=g.mig_enabled,
                    mig_layout=g.mig_layout,
                    shareable=not g.mig_enabled,
                )
                for g in gpus
            )
        return Node(
            name=v.name,
            gpus=gpus,
            cpu_milli=_allocatable(v, "cpu", quantity.cpu_milli, where),
            memory_mib=_allocatable(v, "memory", quantity.memory_mib, where),
            topology=topology,
            labels=dict(v.labels),
            taints=v.taints,
            rack=v.labels.get(LABEL_RACK, ""),
            zone=v.labels.get(LABEL_ZONE, ""),
            clique=v.labels.get(LABEL_CLIQUE, ""),
            pool=v.labels.get(LABEL_POOL, ""),
            schedulable=not v.unschedulable,
            mig_reconfigurable=v.labels.get(LABEL_MIG_CAPABLE, "").lower() == "true"
            and LABEL_MIG_CONFIG in v.labels,
        )
    except InvalidRequest as e:
        if e.field.startswith(where):
            raise
        raise InvalidRequest(f"{where} {e.field}", e.value, e.valid) from None


def _allocatable(v: NodeView, key: str, parse: Any, where: str) -> int:
    raw = v.allocatable.get(key)
    if raw is None:
        return 0
    result: int = parse(raw, field=f"{where} allocatable {key}")
    return result


def _gpus_from_labels(v: NodeView, where: str) -> tuple[GPU, ...]:
    product_label = v.labels.get(LABEL_PRODUCT, "")
    product, single_profile = products.split_mig_suffix(product_label)
    model = products.model_name(product) if product else "UNKNOWN"
    known = products.lookup(product) if product else None
    strategy = v.labels.get(LABEL_MIG_STRATEGY, "none").lower()
    whole = _count(v.allocatable.get(GPU_RESOURCE), f"{where} allocatable {GPU_RESOURCE}")
    labelled = _count(v.labels.get(LABEL_COUNT), f"{where} label {LABEL_COUNT}")

    if strategy == "single" and single_profile is not None:
        geom = _geometry(model, where)
        instances = whole if whole is not None else (labelled or 0)
        layouts = _pack(geom, {single_profile: instances}, None, where)
        full_memory = geom.profile(geom_full(geom)).memory_mib
        return _mig_gpus(model, full_memory, layouts, 0)

    count = labelled if labelled is not None else (whole or 0)
    memory = _count(v.labels.get(LABEL_MEMORY), f"{where} label {LABEL_MEMORY}")
    if memory is None:
        if known is None:
            raise InvalidRequest(
                f"{where} label {LABEL_MEMORY}", "(missing)", f"the GPU memory in MiB for {model}"
            )
        memory = known.memory_mib

    mig_counts = _mig_counts(v, where) if strategy == "mixed" else {}
    if not mig_counts:
        return tuple(GPU(index=i, model=model, memory_mib=memory) for i in range(count))
    geom = _geometry(model, where)
    # Under the mixed strategy the device plugin advertises the GPUs not in MIG mode as
    # nvidia.com/gpu; every other GPU is in MIG mode, possibly without instances yet.
    mig_gpu_count = count - (whole or 0)
    layouts = _pack(geom, mig_counts, mig_gpu_count, where)
    return _mig_gpus(model, memory, layouts, count - len(layouts))


def geom_full(geom: mig.MigGeometry) -> str:
    """The profile that takes the whole GPU (its memory is the GPU's MIG-visible memory)."""
    return max(geom.profiles.values(), key=lambda p: (p.memory_slices, p.compute_slices)).name


def _mig_gpus(
    model: str, memory: int, layouts: list[list[mig.MigInstance]], plain: int
) -> tuple[GPU, ...]:
    gpus = [
        GPU(index=i, model=model, memory_mib=memory, mig_enabled=True, mig_layout=tuple(layout))
        for i, layout in enumerate(layouts)
    ]
    gpus += [GPU(index=len(gpus) + i, model=model, memory_mib=memory) for i in range(plain)]
    return tuple(gpus)


def _mig_counts(v: NodeView, where: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, value in v.labels.items():
        if key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(".count"):
            profile = key[len(MIG_RESOURCE_PREFIX) : -len(".count")]
            counts[profile] = _count(value, f"{where} label {key}") or 0
    if not counts:  # no GFD labels: fall back to what the device plugin advertises
        for key, value in v.allocatable.items():
            if key.startswith(MIG_RESOURCE_PREFIX):
                counts[key[len(MIG_RESOURCE_PREFIX) :]] = (
                    _count(value, f"{where} allocatable {key}") or 0
                )
    return {p: n for p, n in counts.items() if n > 0}


def _pack(
    geom: mig.MigGeometry, counts: Mapping[str, int], gpus: int | None, where: str
) -> list[list[mig.MigInstance]]:
    """A valid layout of ``counts`` instances on exactly ``gpus`` GPUs (as few as possible when
    ``gpus`` is None).

    First the same layout on every GPU (what mig-parted configurations such as
    ``all-balanced`` produce); failing that, any valid packing (a bounded depth-first search).
    """
    for name in counts:
        geom.profile(name)  # a clear error for a profile this model does not have
    total = sum(counts.values())
    described = ", ".join(f"{n}x {p}" for p, n in sorted(counts.items()))
    candidates = [gpus] if gpus is not None else list(range(1, total + 1))
    for g in candidates:
        if g > 0 and all(n % g == 0 for n in counts.values()):
            per_gpu = _expand(geom, {p: n // g for p, n in counts.items()})
            layout = _search(geom, per_gpu, 1)
            if layout is not None:
                return [list(layout[0]) for _ in range(g)]
    limit = gpus if gpus is not None else total
    found = _search(geom, _expand(geom, counts), limit)
    if found is None:
        raise InvalidRequest(
            f"{where} MIG instances", described, f"instances that fit on {limit} {geom.model} GPUs"
        )
    if gpus is not None:
        found += [[] for _ in range(gpus - len(found))]
    return found


def _expand(geom: mig.MigGeometry, counts: Mapping[str, int]) -> list[str]:
    """Instances largest first, so the search places the hardest ones early."""
    names = [p for p, n in counts.items() for _ in range(n)]
    return sorted(
        names, key=lambda p: (-geom.profiles[p].memory_slices, -geom.profiles[p].compute_slices, p)
    )


_SEARCH_BUDGET = 20_000


def _search(
    geom: mig.MigGeometry, todo: list[str], limit: int
) -> list[list[mig.MigInstance]] | None:
    """Place every instance on at most ``limit`` GPUs; ``None`` if impossible (or too costly)."""
    layouts: list[list[mig.MigInstance]] = []
    steps = 0

    def place(k: int) -> bool:
        nonlocal steps
        steps += 1
        if k == len(todo):
            return True
        if steps > _SEARCH_BUDGET:
            return False
        name = todo[k]
        tried: set[tuple[mig.MigInstance, ...]] = set()
        for layout in [*layouts, None]:
            if layout is None:
                if len(layouts) >= limit:
                    break
                layout = []
                layouts.append(layout)
            key = tuple(sorted(layout, key=lambda i: (i.start, i.profile)))
            if key in tried:  # an identical GPU was already tried
                continue
            tried.add(key)
            for start in mig.free_starts(geom, name, layout):
                layout.append(mig.MigInstance(profile=name, start=start))
                if place(k + 1):
                    return True
                layout.pop()
            if not layout:
                layouts.pop()
        return False

    if not place(0):
        return None
    for layout in layouts:
        layout.sort(key=lambda i: i.start)
    return layouts


def _geometry(model: str, where: str) -> mig.MigGeometry:
    try:
        return mig.geometry(model)
    except InvalidRequest as e:
        raise InvalidRequest(f"{where} {e.field} (MIG labels present)", e.value, e.valid) from None


def _count(raw: str | None, field: str) -> int | None:
    return None if raw is None else quantity.count(raw, field=field)


class KubernetesInventory:
    """The GPU nodes of a Kubernetes cluster, listed and then watched.

    ``snapshot()`` lists Nodes with the synchronous client when one is given (otherwise it
    returns what is known, which is nothing before the first ``refresh()``/``watch()``).
    ``watch()`` continues from the resourceVersion of the last list, so no change between
    ``snapshot()`` and ``watch()`` is lost; when the apiserver answers 410 Gone (the version is
    too old) it lists again and yields the differences. Nodes that cannot be understood are
    logged and treated as absent. Status-only changes that do not change the ``Node`` value
    (kubelet heartbeats) yield nothing.
    """

    def __init__(
        self,
        async_core_v1: Any,
        *,
        core_v1: Any = None,
        label_selector: str | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        self._api = async_core_v1
        self._sync_api = core_v1
        self._selector = label_selector
        self._timeout = watch_timeout_s
        self._nodes: dict[str, Node] = {}
        self._rv: str | None = None

    @property
    def resource_version(self) -> str | None:
        return self._rv

    def snapshot(self) -> list[Node]:
        if self._sync_api is not None:
            resp = self._sync_api.list_node(**self._list_args())
            self._nodes = _convert_all(resp.items)
            self._rv = resp.metadata.resource_version
        return list(self._nodes.values())

    async def refresh(self) -> list[InventoryEvent]:
        """List again; the events turn the previous state into the listed one."""
        resp = await self._api.list_node(**self._list_args())
        new = _convert_all(resp.items)
        events = diff(self._nodes, new)
        self._nodes = new
        self._rv = resp.metadata.resource_version
        return events

    async def watch(self) -> AsyncIterator[InventoryEvent]:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self._rv is None:
            for event in await self.refresh():
                yield event
        while True:
            try:
                async for event in self._watch_once():
                    yield event
            except ApiException as e:
                if e.status != 410:
                    raise
                log.info("node watch expired at resourceVersion %s (410 Gone); listing", self._rv)
                for event in await self.refresh():
                    yield event

    async def _watch_once(self) -> AsyncIterator[InventoryEvent]:
        from kubernetes_asyncio import watch

        w = watch.Watch(return_type="object")
        async with w.stream(
            self._api.list_node,
            resource_version=self._rv,
            timeout_seconds=self._timeout,
            allow_watch_bookmarks=True,
            **self._list_args(),
        ) as stream:
            async for raw in stream:
                kind = raw["type"]
                obj = raw["raw_object"]
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    event = self._apply(kind, obj)
                    if event is not None:
                        yield event
                if rv:
                    self._rv = rv

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> InventoryEvent | None:
        name = (obj.get("metadata") or {}).get("name", "")
        node = None if kind == "DELETED" else _convert(obj)
        before = self._nodes.get(name)
        if node is None:
            if before is None:
                return None
            del self._nodes[name]
            return InventoryEvent(EventKind.REMOVED, name, None)
        if before == node:
            return None
        self._nodes[name] = node
        return InventoryEvent(EventKind.ADDED if before is None else EventKind.UPDATED, name, node)

    def _list_args(self) -> dict[str, Any]:
        return {"label_selector": self._selector} if self._selector else {}


def _convert(obj: Any) -> Node | None:
    try:
        return to_node(obj)
    except InvalidRequest as e:
        log.warning("ignoring a GPU node that cannot be understood: %s", e.message)
        return None


def _convert_all(items: Iterable[Any]) -> dict[str, Node]:
    out = {}
    for item in items:
        node = _convert(item)
        if node is not None:
            out[node.name] = node
    return out
