"""Recorded gpuportal scores: the golden file that pins the scorer bit for bit.

Every scenario replays one seeded request stream on a mixed cluster (shared T4s, whole-GPU
V100s, an NVSwitch HGX board split over two sockets, a two-socket PCIe box, an A100 pair on
NVLink, MIG A100s with and without reconfiguration, a memory-lean and a CPU-rich node). Each
step records, for every node that passes the host filter, the score of every device option
(``float.hex``, so equality is exact) and what ``score_node`` picks; then the request is placed
with the ``place`` pipeline, applied, observed, and sometimes an earlier placement is released.
It also records the cache token after each step and the learned distribution at checkpoints.

The file holds one digest per step (blake2b of that step's record) and the first
``READABLE_STEPS`` records in full, so a mismatch names the first step that moved.

Regenerate only when a change of scores is intended (and say why in the commit):

    PYTHONPATH=$PWD python -m tests.policies.placement.gpuportal_golden

It was first generated from the scorer before its parts were split into their own modules
(commit "gpuportal golden scores"), so the split is proven to keep every score.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.placement import devices
from policies.placement.framework import Policy
from policies.placement.pipeline import ANYWHERE, NoFit, place, unfit
from policies.placement.scorers.gpuportal import GpuPortal
from policies.placement.state import ClusterState, Placement
from policies.requests import DeviceRequest, TopologyRequirement
from policies.topology import LinkClass, Topology

GOLDEN = Path(__file__).with_name("gpuportal_golden.json")
READABLE_STEPS = 25
GIB = 1024

# (name, GpuPortal keyword arguments, seed, steps). The default scenario is long enough to
# pass two refreshes at the default refresh_every (1024, 2048) and to weigh early requests
# measurably less than late ones under the default half-life.
SCENARIOS: tuple[tuple[str, dict[str, Any], int, int], ...] = (
    ("default", {}, 1, 2600),
    ("refresh-every-request", {"refresh_every": 1}, 2, 500),
    ("short-half-life", {"half_life": 60.0, "refresh_every": 8}, 3, 500),
    ("no-host", {"weight_host": 0.0, "refresh_every": 4}, 4, 400),
    ("no-leftover", {"weight_leftover": 0.0, "refresh_every": 4}, 5, 400),
    ("patience-1", {"leftover_patience": 1.0, "refresh_every": 4}, 6, 400),
    ("no-rounding", {"quantum": 0.0, "refresh_every": 4}, 7, 400),
    ("coarse", {"quantum": 500.0, "weight_frag": 0.5, "coverage": 0.8, "drift": 0.0}, 8, 400),
)


def _gpus(n: int, model: str, memory: int, **kw: Any) -> tuple[GPU, ...]:
    return tuple(GPU(i, model, memory, **kw) for i in range(n))


def cluster() -> ClusterState:
    """The mixed inventory every scenario starts from (node order as listed)."""
    a100 = "A100-40GB"
    mig_layout = (MigInstance("3g.20gb", 0), MigInstance("2g.10gb", 4), MigInstance("1g.5gb", 6))
    nodes = [
        Node("t4-a", _gpus(4, "T4", 15_360, shareable=True), 48_000, 196_608),
        Node("t4-b", _gpus(2, "T4", 15_360, shareable=True), 104_000, 524_288),
        Node("t4-lean", _gpus(8, "T4", 15_360, shareable=True), 96_000, 393_216),
        Node("v100", _gpus(8, "V100M32", 32_768, shareable=True), 96_000, 786_432),
        Node(
            "hgx",
            _gpus(8, "H100-80GB", 81_920),
            128_000,
            1_048_576,
            topology=Topology.uniform(8, LinkClass.NVSWITCH, numa=[0, 0, 0, 0, 1, 1, 1, 1]),
        ),
        Node(
            "pcie",
            _gpus(4, "A10", 24_576, shareable=True),
            64_000,
            262_144,
            topology=Topology.from_numa([0, 0, 1, 1]),
        ),
        Node(
            "nvpair",
            _gpus(2, a100, 40_960),
            32_000,
            131_072,
            topology=Topology.uniform(2, LinkClass.NVLINK, numa=[0, 0]),
        ),
        Node(
            "mig-fixed",
            _gpus(2, a100, 40_960, mig_enabled=True, mig_layout=mig_layout),
            64_000,
            262_144,
        ),
        Node(
            "mig-flex",
            (
                GPU(0, a100, 40_960, mig_enabled=True),
                GPU(1, a100, 40_960, mig_enabled=True, mig_layout=mig_layout),
                GPU(2, a100, 40_960),
            ),
            64_000,
            262_144,
            mig_reconfigurable=True,
        ),
        Node("cpu-only", (), 64_000, 262_144),
    ]
    return ClusterState(nodes)


def _request(rng: random.Random) -> DeviceRequest:
    """One request of an openb-like mix: mostly shares and single GPUs, some CPU-heavy pods."""
    cpu = rng.choice((0, 2_000, 4_000, 8_000, 12_000, 17_000))
    mem = rng.choice((0, 8 * GIB, 16 * GIB, 40 * GIB, 96 * GIB))
    kind = rng.choices(("share", "gpu", "cpu", "mig", "typed"), (45, 30, 10, 8, 7))[0]
    if kind == "share":
        # openb-like sizes, with a rare small filler (1 in 22 shares): only patience above
        # 1 / 0.045 = 22 counts a free share it alone fits as certainly taken.
        milli = rng.choices((470, 810, 650, 320, 230, 500, 110), (25, 20, 15, 15, 12, 8, 4.5))[0]
        cpu = rng.choice((2_000, 4_000)) if milli != 110 else 1_000
        return DeviceRequest(FlavorKind.SHARE, count=1, milli=milli, cpu_milli=cpu, memory_mib=mem)
    if kind == "gpu":
        count = rng.choices((1, 2, 4, 8), (70, 15, 10, 5))[0]
        topo = TopologyRequirement.NVLINK if count > 1 and rng.random() < 0.2 else None
        return DeviceRequest(
            FlavorKind.GPU,
            count=count,
            cpu_milli=cpu,
            memory_mib=mem,
            topology=topo or TopologyRequirement.ANY,
        )
    if kind == "cpu":
        return DeviceRequest(cpu_milli=cpu or 1_000, memory_mib=mem)
    if kind == "mig":
        profile = rng.choice(("1g.5gb", "2g.10gb", "3g.20gb", "1g.10gb"))
        return DeviceRequest(
            FlavorKind.MIG,
            models=frozenset({"A100-40GB"}),
            mig_profile=profile,
            cpu_milli=cpu,
            memory_mib=mem,
        )
    models = frozenset({rng.choice(("T4", "A10", "V100M32"))})
    if rng.random() < 0.5:
        return DeviceRequest(FlavorKind.SHARE, count=1, milli=500, models=models, cpu_milli=cpu)
    return DeviceRequest(FlavorKind.GPU, count=1, models=models, cpu_milli=cpu)


def _req_text(req: DeviceRequest) -> str:
    kind = req.kind.value if req.kind is not None else "cpu"
    models = "+".join(sorted(req.models))
    return (
        f"{kind} n={req.count} m={req.milli} mig={req.mig_profile} models={models} "
        f"cpu={req.cpu_milli} mem={req.memory_mib} topo={req.topology.value}"
    )


def _opt_text(p: Placement) -> str:
    mig = ""
    if p.mig_profile:
        mig = f" mig={p.mig_profile}@{p.mig_start}{'+' if p.mig_created else ''}"
    return f"{p.node}{list(p.gpus)}x{p.milli}{mig}"


def _distribution(gp: GpuPortal) -> list[str]:
    return sorted(
        f"cpu={s.cpu_milli} m={s.milli} n={s.count} models={'+'.join(sorted(s.models))} p={p.hex()}"
        for s, p in gp.distribution.items()
    )


def run(kwargs: dict[str, Any], seed: int, steps: int) -> list[dict[str, Any]]:
    """Every step's record for one scenario (see the module docstring)."""
    return list(records(GpuPortal(**kwargs), seed, steps))


def records(gp: GpuPortal, seed: int, steps: int) -> Iterator[dict[str, Any]]:
    """Each step's record of the scenario ``seed`` scored by ``gp``, as it is made."""
    rng = random.Random(seed)
    cl = cluster()
    pol = Policy("gpuportal", [(gp, 1.0)])
    live: list[Placement] = []
    for step in range(steps):
        req = _request(rng)
        nodes: dict[str, Any] = {}
        for st in cl:
            if unfit(req, st, ANYWHERE) is not None:
                continue
            opts = devices.options(req, st)
            if not opts:
                continue
            scores = [gp.score(req, st, o, cl).hex() for o in opts]
            got = gp.score_node(req, st, opts, cl)
            assert got is not None
            nodes[st.name] = {
                "options": [_opt_text(o) for o in opts],
                "scores": scores,
                "node": [got[0].hex(), opts.index(got[1])],
            }
        placed = place(req, cl, pol)
        record: dict[str, Any] = {"step": step, "request": _req_text(req), "nodes": nodes}
        if isinstance(placed, NoFit):
            gp.observe(req, None)
            record["placed"] = None
        else:
            cl.apply(placed)
            live.append(placed)
            gp.observe(req, placed)
            record["placed"] = _opt_text(placed)
        # Churn: release an earlier placement now and then, so nodes empty as well as fill.
        for _ in range(2 if len(live) > 40 else 1):
            if live and rng.random() < 0.5:
                cl.unapply(live.pop(rng.randrange(len(live))))
        record["token"] = gp.cache_token()
        if step & (step - 1) == 0 or step % 256 == 0:
            record["distribution"] = _distribution(gp)
        yield record


def digest(record: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(record, sort_keys=True).encode(), digest_size=8).hexdigest()


def generate() -> dict[str, Any]:
    golden: dict[str, Any] = {}
    for name, kwargs, seed, steps in SCENARIOS:
        records = run(kwargs, seed, steps)
        golden[name] = {
            "kwargs": kwargs,
            "seed": seed,
            "steps": steps,
            "digests": [digest(r) for r in records],
            "readable": records[:READABLE_STEPS],
        }
    return golden


def main() -> int:
    GOLDEN.write_text(json.dumps(generate(), indent=None, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
