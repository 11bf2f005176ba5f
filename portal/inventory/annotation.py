"""The ``gpuportal.io/topology`` Node annotation our node agent writes.

GPU Feature Discovery labels say how many GPUs of which product a node has, but not how they
are connected, which GPU has which UUID, or where MIG instances sit. The node agent discovers
that with NVML (``portal.inventory.nvml``) and writes it as compact JSON::

    {
      "version": 1,
      "gpus": [
        {"index": 0, "uuid": "GPU-…", "model": "A100-80GB", "memory_mib": 81920,
         "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-…"}]},
        {"index": 1, "uuid": "GPU-…", "model": "A100-80GB", "memory_mib": 81920, "mig": null}
      ],
      "links": [["nvlink", "nvlink"], ["nvlink", "nvlink"]],
      "numa": [0, 0],
      "nvlink_lanes": [[0, 12], [12, 0]]
    }

- ``mig`` is ``null`` when MIG mode is off and a list (possibly empty) of the GPU instances
  when it is on; ``start`` is the first memory slice (NVML's placement start).
- ``links[i][j]`` is a ``policies.topology.LinkClass`` name in lower case (``nvswitch``,
  ``nvlink``, ``same_pcie_switch``, ``same_host_bridge``, ``same_numa``, ``cross_socket``).
- ``nvlink_lanes`` is optional (no NVLink when absent).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies import mig
from policies.errors import InvalidRequest
from policies.inventory import GPU, Node
from policies.topology import LinkClass, Topology

ANNOTATION = "gpuportal.io/topology"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class AgentReport:
    """What the annotation says: the GPUs (never shareable; that is a label) and topology."""

    gpus: tuple[GPU, ...]
    topology: Topology


def encode(node: Node) -> str:
    """The annotation value describing ``node``'s GPUs and topology."""
    topo = node.link_topology
    doc: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_mib": g.memory_mib,
                "mig": [_instance(i) for i in g.mig_layout] if g.mig_enabled else None,
            }
            for g in node.gpus
        ],
        "links": [[c.name.lower() for c in row] for row in topo.links],
        "numa": list(topo.numa),
    }
    if topo.nvlink_lanes:
        doc["nvlink_lanes"] = [list(row) for row in topo.nvlink_lanes]
    return json.dumps(doc, separators=(",", ":"))


def _instance(inst: mig.MigInstance) -> dict[str, Any]:
    out: dict[str, Any] = {"profile": inst.profile, "start": inst.start}
    if inst.uuid:
        out["uuid"] = inst.uuid
    return out


def decode(text: str, *, where: str = ANNOTATION) -> AgentReport:
    """Parse an annotation value; errors name ``where`` (e.g. the node) and the bad field."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"{where} JSON", f"({e.msg} at {e.pos})", "a JSON object") from None
    try:
        return _decode(doc, where)
    except InvalidRequest as e:
        if e.field.startswith(where):
            raise
        raise InvalidRequest(f"{where} {e.field}", e.value, e.valid) from None


def _decode(doc: object, where: str) -> AgentReport:
    obj = _mapping(doc, where)
    if obj.get("version") != FORMAT_VERSION:
        raise InvalidRequest(f"{where} version", obj.get("version"), str(FORMAT_VERSION))
    gpus_raw = _sequence(obj.get("gpus"), f"{where} gpus")
    gpus = tuple(_gpu(raw, i, where) for i, raw in enumerate(gpus_raw))
    n = len(gpus)
    links_raw = _sequence(obj.get("links"), f"{where} links")
    links = tuple(
        tuple(_link(c, f"{where} links[{i}]") for c in _sequence(row, f"{where} links[{i}]"))
        for i, row in enumerate(links_raw)
    )
    numa = tuple(_int(v, f"{where} numa") for v in _sequence(obj.get("numa"), f"{where} numa"))
    lanes_raw = obj.get("nvlink_lanes")
    lanes: tuple[tuple[int, ...], ...] = ()
    if lanes_raw is not None:
        lanes = tuple(
            tuple(_int(v, f"{where} nvlink_lanes") for v in _sequence(r, f"{where} nvlink_lanes"))
            for r in _sequence(lanes_raw, f"{where} nvlink_lanes")
        )
        if len(lanes) != n or any(len(r) != n for r in lanes):
            raise InvalidRequest(f"{where} nvlink_lanes", f"{len(lanes)} rows", f"{n}x{n} counts")
    if len(numa) != n:
        raise InvalidRequest(f"{where} numa", f"{len(numa)} entries", f"{n}, one per GPU")
    return AgentReport(gpus=gpus, topology=Topology(links=links, numa=numa, nvlink_lanes=lanes))


def _gpu(raw: object, position: int, where: str) -> GPU:
    here = f"{where} gpus[{position}]"
    obj = _mapping(raw, here)
    index = _int(obj.get("index"), f"{here} index")
    if index != position:
        raise InvalidRequest(f"{here} index", index, f"{position} (GPUs listed in index order)")
    mig_raw = obj.get("mig")
    layout: tuple[mig.MigInstance, ...] = ()
    if mig_raw is not None:
        layout = tuple(_mig_instance(i, f"{here} mig") for i in _sequence(mig_raw, f"{here} mig"))
    uuid = obj.get("uuid", "")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"{here} model", repr(model), "a model name such as 'H100-80GB'")
    return GPU(
        index=index,
        model=model,
        memory_mib=_int(obj.get("memory_mib"), f"{here} memory_mib"),
        uuid=uuid if isinstance(uuid, str) else "",
        mig_enabled=mig_raw is not None,
        mig_layout=layout,
    )


def _mig_instance(raw: object, here: str) -> mig.MigInstance:
    obj = _mapping(raw, here)
    profile = obj.get("profile")
    if not isinstance(profile, str):
        raise InvalidRequest(f"{here} profile", repr(profile), "a MIG profile name")
    uuid = obj.get("uuid")
    return mig.MigInstance(
        profile=profile,
        start=_int(obj.get("start"), f"{here} start"),
        uuid=uuid if isinstance(uuid, str) and uuid else None,
    )


def _link(raw: object, here: str) -> LinkClass:
    if not isinstance(raw, str):
        raise InvalidRequest(here, repr(raw), "link class names")
    return LinkClass.parse(raw)


def _mapping(raw: object, here: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise InvalidRequest(here, type(raw).__name__, "a JSON object")
    return raw


def _sequence(raw: object, here: str) -> Sequence[Any]:
    if not isinstance(raw, list):
        raise InvalidRequest(here, type(raw).__name__, "a JSON list")
    return raw


def _int(raw: object, here: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidRequest(here, repr(raw), "an integer")
    return raw
