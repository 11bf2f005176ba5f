"""The local host's GPUs, discovered with NVML (``pynvml``, package nvidia-ml-py).

Run ``python -m portal.inventory.nvml [--json]`` on a GPU machine to print what is found.

Topology follows ``nvidia-smi topo -m``: the PCIe common ancestor of each pair gives the
baseline class, NVLink is counted per link (``nvmlDeviceGetNvLinkState`` and the remote PCI
address), and when every GPU's links go to NVSwitches (HGX boards) all pairs are NVSWITCH.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from policies import mig
from policies.errors import InvalidRequest, PortalError
from policies.inventory import GPU, Node
from policies.topology import LinkClass, Topology
from portal.inventory import annotation, products

T = TypeVar("T")

_PCIE_CLASS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: LinkClass.SAME_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_SINGLE: LinkClass.SAME_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_MULTIPLE: LinkClass.SAME_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: LinkClass.SAME_HOST_BRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: LinkClass.SAME_NUMA,
    pynvml.NVML_TOPOLOGY_SYSTEM: LinkClass.CROSS_SOCKET,
}
# Errors that mean "this GPU or driver does not offer that query", not a failure.
_UNSUPPORTED = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_InvalidArgument,
    pynvml.NVMLError_NotFound,
)


class NvmlError(PortalError):
    """NVML failed or reported something we cannot represent."""

    code = "nvml"


class NoDriver(NvmlError):
    """No NVIDIA driver (or no NVML library) on this host."""

    code = "no_driver"


@dataclass(frozen=True, slots=True)
class Host:
    """Where host facts come from; tests point these at fixture files."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    cpu_count: Callable[[], int | None] = os.cpu_count


def discover(node_name: str | None = None, *, host: Host | None = None) -> Node:
    """The local host as a ``Node``: GPUs, MIG instances, topology, CPU and memory."""
    host = host or Host()
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as e:
        raise NoDriver(f"no NVIDIA driver found: {e}") from None
    except pynvml.NVMLError as e:
        raise NvmlError(f"NVML failed to start: {e}") from None
    try:
        return _discover(node_name or _hostname(), host)
    except pynvml.NVMLError as e:
        raise NvmlError(f"NVML query failed: {e}") from None
    finally:
        pynvml.nvmlShutdown()


def _discover(name: str, host: Host) -> Node:
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    gpus = []
    mig_capable = False
    for i, h in enumerate(handles):
        model = products.model_name(pynvml.nvmlDeviceGetName(h))
        mode = _optional(partial(pynvml.nvmlDeviceGetMigMode, h))
        mig_capable = mig_capable or mode is not None
        enabled = mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        layout = _mig_layout(h, model) if enabled else ()
        try:
            gpus.append(
                GPU(
                    index=i,
                    model=model,
                    memory_mib=pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024),
                    uuid=pynvml.nvmlDeviceGetUUID(h),
                    mig_enabled=enabled,
                    mig_layout=layout,
                )
            )
        except InvalidRequest as e:
            raise NvmlError(f"GPU {i} ({model}): {e.message}") from None
    return Node(
        name=name,
        gpus=tuple(gpus),
        cpu_milli=(host.cpu_count() or 0) * 1000,
        memory_mib=_mem_total_mib(host.proc),
        topology=_topology(handles, host) if handles else None,
        mig_reconfigurable=mig_capable,
    )


def _mig_layout(handle: Any, model: str) -> tuple[mig.MigInstance, ...]:
    """GPU instances with their profile and memory-slice start, and the MIG device UUIDs."""
    uuids: dict[int, str] = {}
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        dev = _optional(partial(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, k))
        if dev is None:
            continue
        gi = pynvml.nvmlDeviceGetGpuInstanceId(dev)
        uuids.setdefault(gi, pynvml.nvmlDeviceGetUUID(dev))
    instances = []
    for profile_index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _optional(partial(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile_index))
        if info is None or info.instanceCount == 0:
            continue
        profile = _profile_name(info.name)
        array = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstances(handle, info.id, array, ctypes.byref(count))
        for j in range(count.value):
            gi_info = pynvml.nvmlGpuInstanceGetInfo(array[j])
            instances.append(
                mig.MigInstance(
                    profile=profile, start=gi_info.placement.start, uuid=uuids.get(gi_info.id)
                )
            )
    instances.sort(key=lambda inst: inst.start)
    return tuple(instances)


def _profile_name(raw: bytes | str) -> str:
    """NVML's ``MIG 3g.40gb`` → ``3g.40gb``."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    return re.sub(r"^MIG\s+", "", text.strip())


def _topology(handles: Sequence[Any], host: Host) -> Topology:
    n = len(handles)
    links = [[LinkClass.SAME_PCIE_SWITCH] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
            links[i][j] = links[j][i] = _PCIE_CLASS.get(level, LinkClass.CROSS_SOCKET)
    bus_ids = [_bus_key(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    index_of = {bus: i for i, bus in enumerate(bus_ids)}
    lanes = [[0] * n for _ in range(n)]
    switch_links = [0] * n
    for i, h in enumerate(handles):
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = _optional(partial(pynvml.nvmlDeviceGetNvLinkState, h, link))
            if state is None:
                break  # no NVLink, or no more links on this GPU
            if state != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
            kind = _optional(partial(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link))
            peer = index_of.get(_bus_key(remote.busId))
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH or peer is None:
                switch_links[i] += 1
            elif peer != i:
                lanes[i][peer] += 1
    if n > 1 and all(switch_links):
        for i in range(n):
            for j in range(n):
                links[i][j] = LinkClass.NVSWITCH
                lanes[i][j] = 0 if i == j else min(switch_links[i], switch_links[j])
    else:
        for i in range(n):
            for j in range(n):
                # Lanes are counted from both ends; take the smaller in case one end reports less.
                lanes[i][j] = lanes[j][i] = min(lanes[i][j], lanes[j][i])
                if i != j and lanes[i][j]:
                    links[i][j] = LinkClass.NVLINK
    has_lanes = any(any(row) for row in lanes)
    return Topology(
        links=tuple(tuple(row) for row in links),
        numa=tuple(_numa(h, host) for h in handles),
        nvlink_lanes=tuple(tuple(row) for row in lanes) if has_lanes else (),
    )


def _numa(handle: Any, host: Host) -> int:
    node = _optional(partial(pynvml.nvmlDeviceGetNumaNodeId, handle))
    if node is not None and node >= 0:
        return int(node)
    # Older drivers: the NUMA node whose CPUs the GPU is closest to (its CPU affinity).
    cpu_count = host.cpu_count() or 1
    words = (cpu_count + 63) // 64
    affinity = _optional(partial(pynvml.nvmlDeviceGetCpuAffinity, handle, words))
    if affinity is None:
        return 0
    cpus = {w * 64 + b for w in range(words) for b in range(64) if affinity[w] >> b & 1}
    for numa_id, numa_cpus in sorted(_numa_cpus(host.sys).items()):
        if cpus & numa_cpus:
            return numa_id
    return 0


def _numa_cpus(sys_root: Path) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    base = sys_root / "devices" / "system" / "node"
    for path in base.glob("node[0-9]*"):
        try:
            text = (path / "cpulist").read_text().strip()
        except OSError:
            continue
        cpus: set[int] = set()
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        out[int(path.name[4:])] = cpus
    return out


def _mem_total_mib(proc: Path) -> int:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024  # reported in kB (KiB)
    except OSError:
        pass
    return 0


def _bus_key(raw: bytes | str) -> tuple[int, int, int, int]:
    """``00000000:18:00.0`` and ``0000:18:00.0`` → (domain, bus, device, function)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    m = re.match(r"^\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", text)
    if m is None:
        return (-1, -1, -1, -1)
    domain, bus, dev, fn = (int(x, 16) for x in m.groups())
    return (domain, bus, dev, fn)


def _optional(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except _UNSUPPORTED:
        return None


def _hostname() -> str:
    name = socket.gethostname().split(".")[0].lower()
    return re.sub(r"[^a-z0-9-]+", "-", name).strip("-") or "localhost"


def describe(node: Node) -> str:
    """A human-readable summary of a discovered node."""
    lines = [
        f"{node.name}: {len(node.gpus)} GPU(s), {node.cpu_milli // 1000} CPUs, "
        f"{node.memory_mib} MiB memory"
    ]
    for g in node.gpus:
        mode = (
            "MIG " + ", ".join(f"{i.profile}@{i.start}" for i in g.mig_layout)
            if g.mig_enabled
            else ""
        )
        lines.append(f"  GPU {g.index}: {g.model} {g.memory_mib} MiB {g.uuid} {mode}".rstrip())
    topo = node.link_topology
    for i in range(topo.size):
        row = " ".join(
            "  X " if i == j else f"{topo.link(i, j).name[:4]:>4}" for j in range(topo.size)
        )
        lines.append(f"  GPU {i} [numa {topo.numa[i]}] {row}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m portal.inventory.nvml",
        description="Print this host's GPUs as found by NVML.",
    )
    parser.add_argument("--json", action="store_true", help="print the topology annotation JSON")
    parser.add_argument("--name", help="node name (default: the host name)")
    args = parser.parse_args(argv)
    try:
        node = discover(args.name)
    except NvmlError as e:
        print(e.message, file=sys.stderr)
        return 2
    if args.json:
        doc = json.loads(annotation.encode(node))
        doc["node"] = {
            "name": node.name,
            "cpu_milli": node.cpu_milli,
            "memory_mib": node.memory_mib,
        }
        print(json.dumps(doc, indent=2))
    else:
        print(describe(node))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
