"""Topology quality of placement on a mixed inventory.

``python -m benchmarks.topology [--arrivals 4000] [--seeds 1-3] [--json OUT.json]`` builds a
realistic mixed cluster from the presets (HGX H100 8-GPU NVSwitch nodes, 4-GPU A100 PCIe nodes
with NVLink bridges in pairs, 8-GPU two-socket PCIe nodes; 8 nodes a rack) and drives a
seeded stream of 1/2/4/8-GPU requests with releases, plus multi-node gangs that ask for
``same-rack``, through ``policies.placement.pipeline.place``/``gangs.place_gang`` for each policy.

At every multi-GPU decision the best link class free on *any* feasible node is found by brute
force (every k-subset of every node's free GPUs), and so is whether any node had k free GPUs on
one socket. Reported per policy:

- ``on_best_class``: multi-GPU requests whose chosen set has that best class;
- ``needless_split``: chosen set spans sockets although some node had a one-socket set free;
- ``gangs_one_rack``: gangs placed in one rack/clique, of those for which some rack had room.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from policies.flavors import FlavorKind
from policies.inventory import Node
from policies.placement.framework import Policy
from policies.placement.gangs import place_gang
from policies.placement.pipeline import ANYWHERE, NoFit, place, unfit
from policies.placement.scorers import policy as named_policy
from policies.placement.scorers.binpack import BinPack
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest, TopologyRequirement
from policies.topology import LinkClass
from portal.inventory.simulated import generate

_T = TypeVar("_T")

INVENTORY = {"hgx-h100-8": 24, "a100-pcie-4-nvlink-pairs": 32, "pcie-2socket-8": 24}
# Requested model: None is "any model"; users mostly name one.
MODELS: tuple[tuple[str | None, float], ...] = (
    (None, 0.3),
    ("H100-80GB", 0.3),
    ("A100-80GB", 0.2),
    ("L40S", 0.2),
)
SIZES: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.25), (4, 0.15), (8, 0.10))
GANG_EVERY = 40  # one arrival in this many is a multi-node gang
LOAD = 0.9  # offered GPU load as a share of all GPUs
CPU_PER_GPU = 8_000
MEM_PER_GPU = 64 * 1024
POLICIES = ("gpuportal", "binpack", "bestfit", "packing")


def make_policy(name: str) -> Policy:
    """A named policy; ``packing`` is BinPack's fullest-node rule without the topology term."""
    if name == "packing":
        return Policy("packing", [(BinPack(), 1.0)])
    return named_policy(name)


def request(count: int, model: str | None) -> DeviceRequest:
    return DeviceRequest(
        FlavorKind.GPU,
        count=count,
        models=frozenset({model}) if model else frozenset(),
        cpu_milli=CPU_PER_GPU * count,
        memory_mib=MEM_PER_GPU * count,
    )


def feasible(req: DeviceRequest, cluster: ClusterState) -> Iterable[NodeState]:
    """Nodes that could take one member of ``req`` now, ignoring topology."""
    for st in cluster.candidates(req.models):
        if unfit(req, st, ANYWHERE) is None:
            yield st


def _free(req: DeviceRequest, st: NodeState) -> list[int]:
    gpus = st.node.gpus
    return [i for i in st.free_gpus() if not req.models or gpus[i].model in req.models]


def best_free_class(req: DeviceRequest, cluster: ClusterState) -> LinkClass | None:
    """The best weakest link of any ``req.count`` free GPUs on any feasible node (brute force)."""
    best: LinkClass | None = None
    for st in feasible(req, cluster):
        topo = st.node.link_topology
        for combo in itertools.combinations(_free(req, st), req.count):
            c = topo.worst_link(combo)
            if best is None or c > best:
                best = c
                if best is LinkClass.NVSWITCH:
                    return best
    return best


def best_one_socket_class(req: DeviceRequest, cluster: ClusterState) -> LinkClass | None:
    """The best weakest link of ``req.count`` free GPUs on one NUMA node of any feasible node,
    or None when no node has that many free on one socket (brute force)."""
    best: LinkClass | None = None
    for st in feasible(req, cluster):
        topo = st.node.link_topology
        by_socket: dict[int, list[int]] = {}
        for g in _free(req, st):
            by_socket.setdefault(topo.numa[g], []).append(g)
        for free in by_socket.values():
            for combo in itertools.combinations(free, req.count):
                c = topo.worst_link(combo)
                if best is None or c > best:
                    best = c
    return best


def spans_sockets(node: Node, gpus: Sequence[int]) -> bool:
    numa = node.link_topology.numa
    return len({numa[g] for g in gpus}) > 1


def rack_room(req: DeviceRequest, members: int, cluster: ClusterState) -> bool:
    """Whether some rack/clique could hold every member (free whole GPUs, host fit)."""
    room: dict[str, int] = {}
    for st in feasible(req, cluster):
        key = st.node.clique or st.node.rack
        room[key] = room.get(key, 0) + st.full_free // req.count
    return any(n >= members for k, n in room.items() if k)


@dataclass(slots=True)
class Tally:
    """Counters for one policy over one or more runs."""

    policy: str
    multi_gpu_placed: int = 0
    on_best_class: int = 0
    below_best_by_class: int = 0  # sum of class steps lost (0 when always on the best)
    spans_sockets: int = 0
    needless_split: int = 0  # spans sockets although a one-socket set was free somewhere
    needless_split_no_worse: int = 0  # ... and that one-socket set was as well linked
    single_failed: int = 0
    gangs: int = 0
    gangs_possible: int = 0
    gangs_one_rack: int = 0

    def record(
        self, node: Node, gpus: Sequence[int], best: LinkClass, one_socket: LinkClass | None
    ) -> None:
        """One placed multi-GPU member, against the brute-force facts before the decision."""
        got = node.link_topology.worst_link(gpus)
        self.multi_gpu_placed += 1
        self.on_best_class += got >= best
        self.below_best_by_class += max(0, int(best) - int(got))
        split = spans_sockets(node, gpus)
        self.spans_sockets += split
        self.needless_split += split and one_socket is not None
        self.needless_split_no_worse += split and one_socket is not None and one_socket >= got

    def summary(self) -> dict[str, float | int | str]:
        n = self.multi_gpu_placed or 1
        g = self.gangs_possible or 1
        return {
            **asdict(self),
            "on_best_class_pct": round(100.0 * self.on_best_class / n, 2),
            "needless_split_pct": round(100.0 * self.needless_split / n, 2),
            "needless_split_no_worse_pct": round(100.0 * self.needless_split_no_worse / n, 2),
            "gangs_one_rack_pct": round(100.0 * self.gangs_one_rack / g, 2),
        }


def _pick(rng: random.Random, table: Sequence[tuple[_T, float]]) -> _T:
    return rng.choices([v for v, _ in table], [w for _, w in table])[0]


def run(name: str, seed: int, arrivals: int, tally: Tally | None = None) -> Tally:
    """Drive one seeded stream through policy ``name``; same stream for every policy."""
    nodes = generate(INVENTORY)
    cluster = ClusterState(nodes)
    pol = make_policy(name)
    rng = random.Random(seed)
    t = tally if tally is not None else Tally(name)
    total_gpus = sum(len(n.gpus) for n in nodes)
    mean_gpus = sum(k * w for k, w in SIZES)
    mean_life = LOAD * total_gpus / mean_gpus  # one arrival per time unit
    running: list[tuple[float, int, list[Placement]]] = []
    for now in range(arrivals):
        while running and running[0][0] <= now:
            for p in heapq.heappop(running)[2]:
                cluster.unapply(p)
        model = _pick(rng, MODELS)
        life = rng.expovariate(1.0 / mean_life)
        if now % GANG_EVERY == GANG_EVERY - 1:
            members = rng.randint(2, 4)
            count = 4 if model == "A100-80GB" else 8
            req = request(count, model)
            t.gangs += 1
            possible = rack_room(req, members, cluster)
            t.gangs_possible += possible
            got = place_gang(req, members, cluster, pol, topology=TopologyRequirement.SAME_RACK)
            placed = [] if isinstance(got, NoFit) else got
            if placed:
                racks = {
                    cluster.node(p.node).node.clique or cluster.node(p.node).node.rack
                    for p in placed
                }
                t.gangs_one_rack += possible and len(racks) == 1
        else:
            count = _pick(rng, SIZES)
            req = request(count, model)
            best = best_free_class(req, cluster) if count > 1 else None
            one_socket = best_one_socket_class(req, cluster) if count > 1 else None
            single = place(req, cluster, pol)
            if isinstance(single, NoFit):
                t.single_failed += 1
                placed = []
            else:
                placed = [single]
                if best is not None:
                    t.record(cluster.node(single.node).node, single.gpus, best, one_socket)
        for p in placed:
            cluster.apply(p)
        for p in placed[:1]:
            pol.observe(req, p)
        if not placed:
            pol.observe(req, None)
        if placed:
            heapq.heappush(running, (now + life, now, placed))
    return t


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.topology", description=__doc__)
    ap.add_argument("--arrivals", type=int, default=4000)
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("1-3"))
    ap.add_argument("--policy", action="append", choices=POLICIES, help="repeatable; default all")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = args.policy or list(POLICIES)
    report: dict[str, object] = {
        "inventory": INVENTORY,
        "arrivals": args.arrivals,
        "seeds": args.seeds,
        "policies": {},
    }
    print(
        f"{'policy':<10} {'multi-GPU':>9} {'best class':>10} {'steps lost':>10} "
        f"{'spans':>6} {'needless':>8} {'no-worse':>8} {'gangs one rack':>15} {'failed':>6}"
    )
    for name in names:
        tally = Tally(name)
        for seed in args.seeds:
            run(name, seed, args.arrivals, tally)
        s = tally.summary()
        report["policies"][name] = s  # type: ignore[index]
        print(
            f"{name:<10} {tally.multi_gpu_placed:>9} {s['on_best_class_pct']:>9.2f}% "
            f"{tally.below_best_by_class:>10} {tally.spans_sockets:>6} "
            f"{s['needless_split_pct']:>7.2f}% {s['needless_split_no_worse_pct']:>7.2f}% "
            f"{tally.gangs_one_rack:>5}/{tally.gangs_possible:<4} ({s['gangs_one_rack_pct']:.0f}%) "
            f"{tally.single_failed:>6}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
