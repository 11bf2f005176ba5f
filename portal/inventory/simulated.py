"""A declarative YAML inventory for demos, tests and benchmarks.

The file format is documented in ``docs/inventory.md``. Loading is all-or-nothing: any error
raises ``InvalidRequest`` naming the file, the node and field, the bad value and what would be
valid, and no node is returned.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from policies import mig
from policies.errors import InvalidRequest
from policies.inventory import GPU, Node, Taint, TaintEffect
from portal.inventory import quantity
from portal.inventory.events import InventoryEvent, diff
from portal.inventory.presets import PRESETS, Preset

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DEMO_RESOURCE = "data/demo-inventory.yaml"

_SETTINGS = frozenset(
    {
        "preset",
        "labels",
        "taints",
        "rack",
        "zone",
        "clique",
        "pool",
        "mig",
        "shareable",
        "schedulable",
        "model",
        "gpu_memory_mib",
        "cpu",
        "memory",
    }
)
_NODE_KEYS = _SETTINGS | {"name", "count", "template"}
_TOP_KEYS = frozenset({"version", "templates", "nodes"})
_MIG_ITEM_RE = re.compile(r"^(?P<profile>[0-9]+g\.[0-9]+gb(?:\+me)?)@(?P<start>[0-9]+)$")
_TAINT_RE = re.compile(r"^(?P<key>[^=:]+)(?:=(?P<value>[^:]*))?(?::(?P<effect>\w+))?$")


def load(path: str | Path) -> list[Node]:
    """Load an inventory file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidRequest(
            "inventory file", str(p), f"a readable YAML file ({e.strerror})"
        ) from None
    return loads(text, source=p.name)


def load_demo() -> list[Node]:
    """The demo inventory shipped with the package."""
    text = resources.files("portal").joinpath(DEMO_RESOURCE).read_text(encoding="utf-8")
    return loads(text, source="demo-inventory.yaml")


def loads(text: str, *, source: str = "<inventory>") -> list[Node]:
    """Parse inventory YAML; ``source`` names the file in error messages."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise InvalidRequest(f"{source} YAML", f"({problem}{where})", "valid YAML") from None
    if not isinstance(doc, Mapping):
        raise InvalidRequest(
            source, type(doc).__name__, "a mapping with 'version: 1' and 'nodes: [...]'"
        )
    _check_keys(doc, _TOP_KEYS, source)
    if doc.get("version") != FORMAT_VERSION:
        raise InvalidRequest(f"{source}: version", repr(doc.get("version")), "1")
    templates = _templates(doc.get("templates") or {}, source)
    entries = doc.get("nodes")
    if not isinstance(entries, list) or not entries:
        raise InvalidRequest(f"{source}: nodes", repr(entries), "a non-empty list of nodes")
    nodes: list[Node] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: nodes[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidRequest(where, repr(entry), "a mapping with at least 'name' and 'preset'")
        name = entry.get("name")
        if isinstance(name, str):
            where = f"{where} ({name})"
        for node in _stamp(entry, templates, where):
            if node.name in seen:
                raise InvalidRequest(
                    f"{where} name",
                    repr(node.name),
                    f"a name not already used by {seen[node.name]}",
                )
            seen[node.name] = where
            nodes.append(with_uuids(node))
    return nodes


def generate(nodes_by_preset: Mapping[str, int], *, nodes_per_rack: int = 8) -> list[Node]:
    """Many nodes for benchmarks: ``{"hgx-h100-8": 1250}`` → hgx-h100-8-1 … -1250.

    Racks are filled in order, ``nodes_per_rack`` nodes each (``r1``, ``r2``, …).
    """
    if nodes_per_rack < 1:
        raise InvalidRequest("nodes_per_rack", nodes_per_rack, "an integer >= 1")
    nodes: list[Node] = []
    for preset_name, n in nodes_by_preset.items():
        preset = _preset(preset_name, "generate()")
        if n < 0:
            raise InvalidRequest(f"node count for {preset_name}", n, "an integer >= 0")
        base = _base_node(preset, "generate()")
        for i in range(1, n + 1):
            rack = f"r{len(nodes) // nodes_per_rack + 1}"
            nodes.append(with_uuids(replace(base, name=f"{preset_name}-{i}", rack=rack)))
    return nodes


def with_uuids(node: Node) -> Node:
    """``node`` with a stable UUID on every GPU that has none: ``GPU-sim-<node>-<index>``.

    Simulated GPUs need names like real ones so everything keyed by GPU UUID works in the
    demo too: the spawner's ``CUDA_VISIBLE_DEVICES``, telemetry samples, alerts."""
    if all(g.uuid for g in node.gpus):
        return node
    gpus = tuple(
        g if g.uuid else replace(g, uuid=f"GPU-sim-{node.name}-{g.index}") for g in node.gpus
    )
    return replace(node, gpus=gpus)


class SimulatedInventory:
    """An inventory source over a fixed list of nodes or a YAML file.

    With a file, ``watch()`` re-reads it when it changes (every ``poll_s`` seconds) and yields
    the differences; a file that no longer loads is logged and ignored until it is fixed.
    Without a file ``watch()`` yields nothing.
    """

    def __init__(
        self, nodes: Iterable[Node] = (), *, path: Path | None = None, poll_s: float = 2.0
    ) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._path = path
        self._poll_s = poll_s
        self._stamp = self._file_stamp()

    @classmethod
    def from_file(cls, path: str | Path, *, poll_s: float = 2.0) -> SimulatedInventory:
        p = Path(path)
        return cls(load(p), path=p, poll_s=poll_s)

    @classmethod
    def demo(cls) -> SimulatedInventory:
        return cls(load_demo())

    def snapshot(self) -> list[Node]:
        return list(self._nodes.values())

    async def watch(self) -> AsyncIterator[InventoryEvent]:
        if self._path is None:
            return
        while True:
            await asyncio.sleep(self._poll_s)
            stamp = self._file_stamp()
            if stamp == self._stamp:
                continue
            self._stamp = stamp
            try:
                new = {n.name: n for n in load(self._path)}
            except InvalidRequest as e:
                log.warning("keeping the previous inventory: %s", e.message)
                continue
            events = diff(self._nodes, new)
            self._nodes = new
            for event in events:
                yield event

    def _file_stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size


def _templates(raw: object, source: str) -> dict[str, Mapping[str, Any]]:
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"{source}: templates", repr(raw), "a mapping of name → settings")
    out: dict[str, Mapping[str, Any]] = {}
    for name, settings in raw.items():
        where = f"{source}: templates.{name}"
        if not isinstance(settings, Mapping):
            raise InvalidRequest(where, repr(settings), "a mapping of node settings")
        _check_keys(settings, _SETTINGS, where)
        out[str(name)] = settings
    return out


def _stamp(
    entry: Mapping[str, Any], templates: Mapping[str, Mapping[str, Any]], where: str
) -> list[Node]:
    _check_keys(entry, _NODE_KEYS, where)
    settings: dict[str, Any] = {}
    if "template" in entry:
        t = entry["template"]
        if t not in templates:
            raise InvalidRequest(
                f"{where} template", repr(t), "one of " + (", ".join(sorted(templates)) or "none")
            )
        settings.update(templates[t])
    labels = {**_labels(settings.get("labels"), where), **_labels(entry.get("labels"), where)}
    settings.update(entry)
    settings["labels"] = labels
    name = settings.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where} name", repr(name), "a DNS-1123 node name")
    count = settings.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidRequest(f"{where} count", repr(count), "an integer >= 1")
    if "preset" not in settings:
        raise InvalidRequest(f"{where} preset", "(missing)", "one of " + ", ".join(sorted(PRESETS)))
    node = _node(settings, where)
    if count == 1:
        return [node]
    return [_renamed(node, f"{name}-{i}", where) for i in range(1, count + 1)]


def _renamed(node: Node, name: str, where: str) -> Node:
    try:
        return replace(node, name=name)
    except InvalidRequest as e:
        raise InvalidRequest(f"{where} {e.field}", e.value, e.valid) from None


def _node(s: Mapping[str, Any], where: str) -> Node:
    preset = _preset(s["preset"], where)
    model = _str(s, "model", where, preset.model)
    gpu_memory = s.get("gpu_memory_mib", preset.gpu_memory_mib)
    if isinstance(gpu_memory, bool) or not isinstance(gpu_memory, int) or gpu_memory <= 0:
        raise InvalidRequest(f"{where} gpu_memory_mib", repr(gpu_memory), "an integer > 0 (MiB)")
    shareable = _bool(s, "shareable", where, preset.shareable)
    layouts = _mig(s.get("mig"), preset.gpu_count, where)
    try:
        gpus = tuple(
            GPU(
                index=i,
                model=model,
                memory_mib=gpu_memory,
                mig_enabled=i in layouts,
                mig_layout=layouts.get(i, ()),
                shareable=shareable and i not in layouts,
            )
            for i in range(preset.gpu_count)
        )
    except InvalidRequest as e:
        raise InvalidRequest(f"{where} mig: {e.field}", e.value, e.valid) from None
    cpu = quantity.cpu_milli(s["cpu"], field=f"{where} cpu") if "cpu" in s else preset.cpu_milli
    memory = (
        quantity.memory_mib(s["memory"], field=f"{where} memory")
        if "memory" in s
        else preset.memory_mib
    )
    try:
        return Node(
            name=s["name"],
            gpus=gpus,
            cpu_milli=cpu,
            memory_mib=memory,
            topology=preset.topology(),
            labels=s["labels"],
            taints=_taints(s.get("taints"), where),
            rack=_str(s, "rack", where),
            zone=_str(s, "zone", where),
            clique=_str(s, "clique", where),
            pool=_str(s, "pool", where),
            schedulable=_bool(s, "schedulable", where, True),
            mig_reconfigurable=preset.mig_reconfigurable,
        )
    except InvalidRequest as e:
        if e.field.startswith(where):
            raise
        raise InvalidRequest(f"{where} {e.field}", e.value, e.valid) from None


def _base_node(preset: Preset, where: str) -> Node:
    return _node({"preset": preset.name, "name": preset.name, "labels": {}}, where)


def _preset(name: object, where: str) -> Preset:
    if not isinstance(name, str) or name not in PRESETS:
        raise InvalidRequest(f"{where} preset", repr(name), "one of " + ", ".join(sorted(PRESETS)))
    return PRESETS[name]


def _mig(raw: object, gpu_count: int, where: str) -> dict[int, tuple[mig.MigInstance, ...]]:
    """``{0: ["3g.40gb@0"], "all": [...]}`` → layout per GPU index (explicit indices win)."""
    if raw is None:
        return {}
    here = f"{where} mig"
    valid_keys = f"a GPU index 0..{gpu_count - 1} or 'all'"
    if not isinstance(raw, Mapping):
        raise InvalidRequest(here, repr(raw), f"a mapping of ({valid_keys}) → ['profile@start']")
    everywhere: tuple[mig.MigInstance, ...] | None = None
    out: dict[int, tuple[mig.MigInstance, ...]] = {}
    for key, items in raw.items():
        layout = _mig_items(items, f"{here}[{key}]")
        if key == "all":
            everywhere = layout
            continue
        index = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isdigit():
            index = int(key)
        if index is None or not 0 <= index < gpu_count:
            raise InvalidRequest(f"{here} key", repr(key), valid_keys)
        out[index] = layout
    if everywhere is not None:
        for i in range(gpu_count):
            out.setdefault(i, everywhere)
    return out


def _mig_items(raw: object, here: str) -> tuple[mig.MigInstance, ...]:
    if not isinstance(raw, list):
        raise InvalidRequest(here, repr(raw), "a list of 'profile@start' such as '3g.40gb@0'")
    out = []
    for item in raw:
        m = _MIG_ITEM_RE.match(item) if isinstance(item, str) else None
        if m is None:
            raise InvalidRequest(here, repr(item), "'profile@start' such as '3g.40gb@4'")
        out.append(mig.MigInstance(profile=m.group("profile"), start=int(m.group("start"))))
    return tuple(out)


def _labels(raw: object, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
        raise InvalidRequest(f"{where} labels", repr(raw), "a mapping of string keys to values")
    return {
        k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in raw.items()
    }


def _taints(raw: object, where: str) -> tuple[Taint, ...]:
    if raw is None:
        return ()
    here = f"{where} taints"
    valid = "a list of 'key=value:Effect' or {key, value, effect}"
    if not isinstance(raw, list):
        raise InvalidRequest(here, repr(raw), valid)
    out = []
    for item in raw:
        if isinstance(item, str) and (m := _TAINT_RE.match(item)):
            key, value, effect = m.group("key"), m.group("value") or "", m.group("effect")
        elif isinstance(item, Mapping) and isinstance(item.get("key"), str):
            key, value, effect = item["key"], str(item.get("value", "")), item.get("effect")
        else:
            raise InvalidRequest(here, repr(item), valid)
        try:
            eff = TaintEffect(effect) if effect is not None else TaintEffect.NO_SCHEDULE
        except ValueError:
            raise InvalidRequest(
                f"{here} effect", repr(effect), "one of " + ", ".join(e.value for e in TaintEffect)
            ) from None
        out.append(Taint(key=key, value=value, effect=eff))
    return tuple(out)


def _str(s: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    value = s.get(key, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} {key}", repr(value), "a string")
    return value


def _bool(s: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = s.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where} {key}", repr(value), "true or false")
    return value


def _check_keys(obj: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise InvalidRequest(
            f"{where} key", repr(unknown[0]), "one of " + ", ".join(sorted(allowed))
        )
