"""gpuportal's parts one by one, table-driven, with the arithmetic of each expected value shown."""

from __future__ import annotations

import math

import pytest

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.placement.scorers.fragmentation import FragmentationGain, Shape, key_after, state_key
from policies.placement.scorers.gpuportal import GpuPortal
from policies.placement.scorers.host import HostGain
from policies.placement.scorers.leftover import LeftoverGain
from policies.placement.scorers.mig_slots import MigSlots
from policies.placement.scorers.mix import Learned, RequestMix
from policies.placement.scorers.topology_rank import RANKS, TopologyRank
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest
from policies.topology import LinkClass, Topology

GIB = 1024
HALF = Shape(0, 500, 1)
ONE = Shape(0, 1000, 1)
TWO = Shape(0, 1000, 2)


def t4_node(free: tuple[int, ...], cpu_free: int = 64_000, cpu: int = 64_000) -> NodeState:
    """A node of T4s whose GPUs have ``free`` milli and ``cpu_free`` CPU left."""
    gpus = tuple(GPU(i, "T4", 15_360, shareable=True) for i in range(len(free)))
    cl = ClusterState([Node("n", gpus, cpu, 256 * GIB)])
    for i, f in enumerate(free):
        if f < 1000:
            cl.apply(Placement("n", gpus=(i,), milli=1000 - f))
    if cpu_free < cpu:
        cl.apply(Placement("n", cpu_milli=cpu - cpu_free))
    return cl.node("n")


def gain(term: FragmentationGain | HostGain | LeftoverGain, st: NodeState, opt: Placement) -> float:
    return term.gain(st, opt, state_key(st), key_after(st, opt))


@pytest.mark.parametrize(
    ("typical", "free", "cpu_free", "opt", "expected"),
    [
        # {0.5: 1}, free (1000, 300): the 300 is stranded, F = 300. A 0.2 share on GPU 1 leaves
        # (1000, 100): F = 100 → Δ = 200.
        ([(HALF, 1.0)], (1000, 300), 64_000, Placement("n", (1,), 200), 200),
        # The same share on GPU 0 leaves (800, 300): the 0.5 still fits, F stays 300 → Δ = 0.
        ([(HALF, 1.0)], (1000, 300), 64_000, Placement("n", (0,), 200), 0),
        # {2 GPUs: 1}, both free: F = 0. Taking one leaves one, which no 2-GPU pod can use:
        # F = 1000 → Δ = −1000.
        ([(TWO, 1.0)], (1000, 1000), 64_000, Placement("n", (0,), 1000), -1000),
        # {1 GPU with 16 cores: 1}, 24 cores free: a 10-core CPU-only pod leaves 14, too few:
        # all 2000 idle milli are stranded → Δ = 0 − 2000.
        (
            [(Shape(16_000, 1000, 1), 1.0)],
            (1000, 1000),
            24_000,
            Placement("n", cpu_milli=10_000),
            -2000,
        ),
        # {1 GPU: 0.5, 2 GPUs: 0.5}, free (1000, 1000, 1000): F = 0; one GPU taken leaves two,
        # both shapes still fit → Δ = 0; two taken: the 2-GPU shape strands 1000 → Δ = −500.
        ([(ONE, 1.0), (TWO, 1.0)], (1000,) * 3, 64_000, Placement("n", (0,), 1000), 0),
        ([(ONE, 1.0), (TWO, 1.0)], (1000,) * 3, 64_000, Placement("n", (0, 1), 1000), -500),
    ],
)
def test_fragmentation_gain(
    typical: list[tuple[Shape, float]],
    free: tuple[int, ...],
    cpu_free: int,
    opt: Placement,
    expected: float,
) -> None:
    st = t4_node(free, cpu_free)
    assert gain(FragmentationGain(typical), st, opt) == pytest.approx(expected)


def g2_node() -> NodeState:
    """An empty openb G2 node: 8 GPUs, 96 cores, 384 GiB."""
    gpus = tuple(GPU(i, "G2", 16_384, shareable=True) for i in range(8))
    return ClusterState([Node("g2", gpus, 96_000, 384 * GIB)]).node("g2")


POD = Placement("g2", cpu_milli=17_000, memory_mib=50 * GIB)  # CPU only: 17 cores, 50 GiB


@pytest.mark.parametrize(
    ("ratios", "opt", "expected"),
    [
        # Openb mix: 10.9 CPU milli and 41.1 MiB per GPU milli. Empty: min(96 000 / 10.9,
        # 393 216 / 41.1) = min(8 807, 9 567) ≥ 8 000 → D = 0. After the pod: min(79 000 / 10.9,
        # 342 016 / 41.1) = min(7 248, 8 322) → D = 8 000 − 7 248 = 752 → gain −752.
        ((10.9, 41.1), POD, -(8000 - 79_000 / 10.9)),
        # Memory alone does not bind: 8 322 ≥ 8 000 → 0.
        ((0.0, 41.1), POD, 0.0),
        ((10.9, 0.0), POD, -(8000 - 79_000 / 10.9)),
        # Memory binds: 4 cores and 96 GiB at 8 CPU milli and 40.96 MiB per GPU milli leave
        # CPU for 92 000 / 8 = 11 500 but memory for (393 216 − 98 304) / 40.96 = 7 200 of the
        # 8 000 idle milli → D = 800 → gain −800.
        ((8.0, 40.96), Placement("g2", cpu_milli=4_000, memory_mib=96 * GIB), -800.0),
        # Nothing learned yet: the term is 0.
        ((0.0, 0.0), POD, 0.0),
        # A GPU pod of 17 cores also takes 1000 idle milli: 7 000 idle, 7 248 fed → D = 0.
        ((10.9, 41.1), Placement("g2", (0,), 1000, cpu_milli=17_000, memory_mib=50 * GIB), 0.0),
    ],
)
def test_host_gain(ratios: tuple[float, float], opt: Placement, expected: float) -> None:
    assert gain(HostGain(*ratios), g2_node(), opt) == pytest.approx(expected)


MIX_470_810 = [(Shape(0, 470, 1), 1.0), (Shape(0, 810, 1), 1.0), (ONE, 2.0)]


@pytest.mark.parametrize(
    ("patience", "opt_gpu", "expected"),
    [
        # Shares {470: 0.5, 810: 0.5} (whole GPUs do not count), free (1000, 530), a 470 share.
        # Patience 1: V(530) = 0.5 · 530 + 0.5 · V(60) = 295, V(60) = 60. Into the 530:
        # L goes 295 → 60, gain 235.
        (1.0, 1, 235.0),
        # On the free GPU: (530, 530), L goes 295 → 590, gain −295.
        (1.0, 0, -295.0),
        # Patience 20: half the share requests fit a 530, so it is taken: V(530) = V(60) = 60.
        # Into the 530: 60 → 60, gain 0; on the free GPU: 60 → 120, gain −60.
        (20.0, 1, 0.0),
        (20.0, 0, -60.0),
    ],
)
def test_leftover_gain(patience: float, opt_gpu: int, expected: float) -> None:
    st = t4_node((1000, 530))
    term = LeftoverGain(MIX_470_810, patience)
    assert not term.empty
    assert gain(term, st, Placement("n", (opt_gpu,), 470)) == pytest.approx(expected)


def test_leftover_gain_without_shares_is_empty() -> None:
    assert LeftoverGain([(ONE, 1.0), (TWO, 1.0)], 20.0).empty


def _topo_node(name: str, n: int, topology: Topology) -> NodeState:
    gpus = tuple(GPU(i, "H100-80GB", 81_920) for i in range(n))
    return ClusterState([Node(name, gpus, 64_000, 512 * GIB, topology=topology)]).node(name)


HGX = Topology.uniform(8, LinkClass.NVSWITCH, numa=[0, 0, 0, 0, 1, 1, 1, 1])
PAIR = Topology.uniform(2, LinkClass.NVLINK, numa=[0, 0])
PCIE = Topology.from_numa([0, 0, 1, 1])


@pytest.mark.parametrize(
    ("topology", "gpus", "steps"),
    [
        (HGX, (0, 1), 13),  # NVSwitch (6), one socket: 2 · 6 + 1
        (HGX, (3, 4), 12),  # NVSwitch across the sockets: 2 · 6 + 0
        (PAIR, (0, 1), 11),  # NVLink (5), one socket: 2 · 5 + 1
        (PCIE, (0, 1), 5),  # same NUMA node (2), one socket: 2 · 2 + 1
        (PCIE, (1, 2), 2),  # cross socket (1): 2 · 1 + 0
        (PCIE, (0, 1, 2, 3), 2),  # the weakest link counts
        (HGX, (5,), 13),  # one GPU: nothing to link, best rank
        (HGX, (), 13),  # CPU only
    ],
)
def test_topology_rank(topology: Topology, gpus: tuple[int, ...], steps: int) -> None:
    st = _topo_node("t", topology.size, topology)
    opt = Placement("t", gpus=gpus, milli=1000 if gpus else 0)
    assert TopologyRank().steps(st, opt) == steps
    assert TopologyRank().rank(st, opt) == steps / RANKS


A100 = "A100-40GB"
LAYOUT = (MigInstance("3g.20gb", 0), MigInstance("2g.10gb", 4), MigInstance("1g.5gb", 6))


def _mig_node(reconfigurable: bool) -> NodeState:
    """Reconfigurable: one A100 with no instances. Fixed: two A100s with LAYOUT, all free."""
    if reconfigurable:
        gpus: tuple[GPU, ...] = (GPU(0, A100, 40_960, mig_enabled=True),)
    else:
        gpus = tuple(GPU(i, A100, 40_960, mig_enabled=True, mig_layout=LAYOUT) for i in range(2))
    node = Node("m", gpus, 64_000, 256 * GIB, mig_reconfigurable=reconfigurable)
    return ClusterState([node]).node("m")


def _mig(profile: str, start: int, created: bool) -> Placement:
    return Placement("m", gpus=(0,), mig_profile=profile, mig_start=start, mig_created=created)


@pytest.mark.parametrize(
    ("reconfigurable", "demand", "opt", "expected"),
    [
        # Empty reconfigurable A100, demand {1g.5gb: 0.5, 7g.40gb: 0.5}. A new 1g.5gb at 0 still
        # leaves room for 1g.5gb, not for 7g.40gb: served 0.5; created: existing 0; no instances
        # on the node before: free share 0 → 100 · (0.7 · 0.5 + 0.2 · 0 + 0.1 · 1) = 45.
        (True, {"1g.5gb": 1.0, "7g.40gb": 1.0}, _mig("1g.5gb", 0, True), 45.0),
        # A new 7g.40gb fills the GPU: served 0 → 100 · (0 + 0 + 0.1 · 1) = 10.
        (True, {"1g.5gb": 1.0, "7g.40gb": 1.0}, _mig("7g.40gb", 0, True), 10.0),
        # Fixed layouts, nothing learned: only the asked 1g.5gb counts, and GPU 0's only one is
        # taken: served 0; existing 1; all 6 instances free: free share 6 / 6 → 100 · (0 + 0.2
        # · 1 + 0.1 · 0) = 20.
        (False, {}, _mig("1g.5gb", 6, False), 20.0),
        # Demand {2g.10gb: 1}: the 2g.10gb at 4 stays free → served 1 → 100 · (0.7 + 0.2) = 90.
        (False, {"2g.10gb": 1.0}, _mig("1g.5gb", 6, False), 90.0),
        # Demand for another model only: as if nothing were learned → 20.
        (False, {"other": 1.0}, _mig("1g.5gb", 6, False), 20.0),
    ],
)
def test_mig_slots(
    reconfigurable: bool, demand: dict[str, float], opt: Placement, expected: float
) -> None:
    total = sum(demand.values())
    dist = {
        ("A30-24GB" if p == "other" else A100, "1g.6gb" if p == "other" else p): w / total
        for p, w in demand.items()
    }
    got = MigSlots(dist, 0.7, 0.2, 0.1).score(_mig_node(reconfigurable), opt)
    assert got == pytest.approx(expected)


def share(milli: int, cpu: int = 0) -> DeviceRequest:
    return DeviceRequest(FlavorKind.SHARE, count=1, milli=milli, cpu_milli=cpu)


def test_request_mix_docstring_example() -> None:
    # Half-life 2: weights 1, √2, 2, 2√2. 500: 1 + √2; 300: 2 + 2√2 = 2 · (1 + √2) → 2/3, 1/3.
    rm = RequestMix(half_life=2.0, coverage=0.95, refresh_every=1024, drift=0.02)
    got = [rm.observe(share(m)) for m in (500, 500, 300, 300)]
    # Refreshes after the 1st, 2nd and 4th: the 1st adopts {500: 1} (PRIOR moves 0.7), the
    # 2nd sees no move, the 3rd is not a refresh.
    assert got == [Learned.SHAPES, Learned.NOTHING, Learned.NOTHING, Learned.SHAPES]
    p300, p500 = rm.distribution[Shape(0, 300, 1)], rm.distribution[Shape(0, 500, 1)]
    assert [p300, p500] == pytest.approx([2 / 3, 1 / 3])
    assert rm.generation == 2


def test_request_mix_coverage_drops_the_rare_tail() -> None:
    # One share of 300, then 19 of 500 (the half-life is long enough to weigh them alike, the
    # later a hair more): the 500 covers 0.95 of the mass, so the 300 is left out at coverage
    # 0.95 and kept at 0.96.
    for coverage, shapes in ((0.95, 1), (0.96, 2)):
        rm = RequestMix(half_life=1e12, coverage=coverage, refresh_every=4, drift=0.0)
        for m in [300] + [500] * 19:
            rm.observe(share(m))
        assert len(rm.distribution) == shapes


def test_request_mix_learns_host_ratios_with_the_distribution() -> None:
    rm = RequestMix(half_life=1e12, coverage=0.95, refresh_every=1024, drift=0.02)
    gpu8 = DeviceRequest(FlavorKind.GPU, count=1, cpu_milli=8_000, memory_mib=40 * GIB)
    gpu16 = DeviceRequest(FlavorKind.GPU, count=1, cpu_milli=16_000)
    # 1st: a new distribution and the first ratios (8 000 / 1 000, 40 960 / 1 000): one
    # generation for both.
    assert rm.observe(gpu8) == Learned.SHAPES | Learned.HOST
    assert (rm.cpu_ratio, rm.memory_ratio, rm.generation) == (8.0, 40.96, 1)
    # 2nd: same distribution; the ratios are known, so not re-read.
    assert rm.observe(gpu8) == Learned.NOTHING
    # 3rd: another shape, no refresh due: the ratios wait for the next adoption...
    assert rm.observe(gpu16) == Learned.NOTHING
    assert rm.cpu_ratio == 8.0
    # ...at the 4th: {8-core GPU: 2, 16-core GPU: 2} → CPU (8 000 · 2 + 16 000 · 2) / 4 000.
    assert rm.observe(gpu16) == Learned.SHAPES | Learned.HOST
    assert rm.cpu_ratio == pytest.approx(12.0)
    assert rm.generation == 2


def test_request_mix_learns_mig_profiles() -> None:
    rm = RequestMix(half_life=1e12, coverage=0.95, refresh_every=1024, drift=0.02)
    req = DeviceRequest(FlavorKind.MIG, models=frozenset({A100}), mig_profile="1g.5gb")
    assert rm.observe(req) == Learned.MIG
    assert rm.mig_distribution == {(A100, "1g.5gb"): 1.0}


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize(
    ("overrides", "gpu", "expected"),
    [
        # The module docstring's example: mix {0.5: 1}, free (1000, 300), a 0.2 share, no host
        # demand. GPU 1: ΔF = 200, rounded 200, + 0.2 · ΔL (300 − 100) → 240.
        ({}, 1, 100 * (0.8 * sigmoid(0.24) + 0.2)),  # 64.78
        # GPU 0: ΔF = 0, + 0.2 · ΔL (300 − 600) → −60.
        ({}, 0, 100 * (0.8 * sigmoid(-0.06) + 0.2)),  # 58.80
        ({"weight_leftover": 0.0}, 1, 100 * (0.8 * sigmoid(0.2) + 0.2)),  # 63.99
        ({"weight_leftover": 0.0}, 0, 60.0),
        ({"weight_frag": 0.5}, 1, 100 * (0.5 * sigmoid(0.24) + 0.5)),  # 77.99
        # Quantum 500: ΔF 200 rounds to 0 → Δ = 0.2 · 200 = 40.
        ({"quantum": 500.0}, 1, 100 * (0.8 * sigmoid(0.04) + 0.2)),  # 60.80
    ],
)
def test_composition(overrides: dict[str, float], gpu: int, expected: float) -> None:
    gp = GpuPortal(refresh_every=1, **overrides)
    for _ in range(4):
        gp.observe(share(500), None)
    st = t4_node((1000, 300))
    cl = ClusterState()
    assert gp.score(share(200), st, Placement("n", (gpu,), 200), cl) == pytest.approx(expected)


def test_composition_ranks_multi_gpu_options_before_fragmentation() -> None:
    # Two GPUs on the HGX board, one socket: rank 13 / 13; {2 GPUs: 1} learned: taking two of
    # eight leaves six (three pairs fit) → ΔF = 0, host 0, no shares → frag = 0.5:
    # 100 · (0.95 · 1 + 0.05 · 0.5) = 97.5. Across the sockets: rank 12 / 13 → 90.19.
    gp = GpuPortal(refresh_every=1)
    two = DeviceRequest(FlavorKind.GPU, count=2)
    gp.observe(two, None)
    st = _topo_node("t", 8, HGX)
    cl = ClusterState()
    one = gp.score(two, st, Placement("t", (0, 1), 1000), cl)
    split = gp.score(two, st, Placement("t", (3, 4), 1000), cl)
    assert [one, split] == pytest.approx([97.5, 100 * (0.95 * 12 / 13 + 0.025)])
