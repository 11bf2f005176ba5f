"""Reading the openb CSVs and turning rows into the portal's inventory and requests."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from policies.flavors import MILLI_PER_GPU, FlavorKind
from policies.inventory import GPU, Node
from policies.placement.scorers.fragmentation import Shape
from policies.requests import DeviceRequest

DEFAULT_TRACE_DIR = Path("../shared/traces/openb")
DEFAULT_NODES = DEFAULT_TRACE_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = DEFAULT_TRACE_DIR / "openb_pod_list_default.csv"

# GPU memory per model; the trace has none and shares in it ask for no GPU memory, so the value
# only has to be positive. Known models get their real size for readability.
GPU_MEMORY_MIB = {"P100": 16_384, "T4": 15_360, "V100M16": 16_384, "V100M32": 32_768, "A10": 24_576}
DEFAULT_GPU_MEMORY_MIB = 16_384


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    def to_node(self) -> Node:
        mem = GPU_MEMORY_MIB.get(self.model, DEFAULT_GPU_MEMORY_MIB)
        gpus = tuple(GPU(i, self.model, mem, shareable=True) for i in range(self.gpus))
        return Node(self.name, gpus, self.cpu_milli, self.memory_mib)


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    # When the pod was created and deleted (seconds from the trace's start) and its QoS
    # class; the placement protocol ignores them, the time replay (benchmarks.replay) uses them.
    creation_time: int = 0
    deletion_time: int | None = None
    qos: str = ""

    @property
    def total_milli(self) -> int:
        """GPU demand in milli-GPU (per-GPU share × GPUs)."""
        return self.num_gpu * self.gpu_milli

    @property
    def models(self) -> frozenset[str]:
        return frozenset(m for m in self.gpu_spec.split("|") if m)

    def to_request(self) -> DeviceRequest:
        """num_gpu 0 → CPU-only; a share below 1000 → ``share``; otherwise whole GPUs."""
        if self.num_gpu == 0 or self.gpu_milli == 0:
            return DeviceRequest(cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)
        if self.gpu_milli < MILLI_PER_GPU:
            return DeviceRequest(
                FlavorKind.SHARE,
                count=1,
                milli=self.gpu_milli,
                models=self.models,
                cpu_milli=self.cpu_milli,
                memory_mib=self.memory_mib,
            )
        return DeviceRequest(
            FlavorKind.GPU,
            count=self.num_gpu,
            models=self.models,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
        )

    def shape(self) -> Shape:
        if self.num_gpu == 0 or self.gpu_milli == 0:
            return Shape(self.cpu_milli, 0, 0, self.models)
        return Shape(self.cpu_milli, self.gpu_milli, self.num_gpu, self.models)


def read_nodes(path: Path) -> list[TraceNode]:
    with path.open(newline="") as f:
        return [
            TraceNode(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
            for r in csv.DictReader(f)
        ]


def read_pods(path: Path) -> list[TracePod]:
    with path.open(newline="") as f:
        return [
            TracePod(
                r["name"],
                int(r["cpu_milli"]),
                int(r["memory_mib"]),
                int(r["num_gpu"]),
                int(r["gpu_milli"]),
                r.get("gpu_spec", "") or "",
                int(r.get("creation_time") or 0),
                int(r["deletion_time"]) if r.get("deletion_time") else None,
                r.get("qos", "") or "",
            )
            for r in csv.DictReader(f)
        ]


def typical_shapes(pods: Sequence[TracePod], coverage: float = 0.95) -> list[tuple[Shape, float]]:
    """The most frequent shapes covering ``coverage`` of the pods, renormalised (as the paper).

    Shapes are (CPU, per-GPU milli, GPU count, model constraint); CPU-only pods count. Equal
    counts are ordered as the simulator does (larger CPU, milli, count, spec first).
    """
    counts = Counter((p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_spec) for p in pods)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = sum(counts.values())
    chosen: list[tuple[tuple[int, int, int, str], int]] = []
    cum = 0
    for key, n in ranked:
        if cum >= coverage * total:
            break
        chosen.append((key, n))
        cum += n
    out = []
    for (cpu, milli, num, spec), n in chosen:
        models = frozenset(m for m in spec.split("|") if m)
        shape = Shape(cpu, milli if num else 0, num if milli else 0, models)
        out.append((shape, n / cum))
    return out
