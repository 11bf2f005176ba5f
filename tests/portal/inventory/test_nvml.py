"""NVML discovery against a fake NVML C library (tests/support/fake_nvml.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.topology import LinkClass, Topology
from portal.inventory import annotation, nvml
from tests.support import fake_nvml
from tests.support.fake_nvml import Driver

L = LinkClass


@pytest.fixture
def host(tmp_path: Path) -> nvml.Host:
    """A host with 32 CPUs on two NUMA nodes and 512 GiB of memory."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(
        "MemTotal:       536870912 kB\nMemFree:        1000 kB\n"
    )
    for numa, cpus in ((0, "0-15"), (1, "16-31")):
        d = tmp_path / "sys" / "devices" / "system" / "node" / f"node{numa}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return nvml.Host(proc=tmp_path / "proc", sys=tmp_path / "sys", cpu_count=lambda: 32)


def test_hgx_h100_is_one_nvswitch_domain_over_two_numa_nodes(
    monkeypatch: pytest.MonkeyPatch, host: nvml.Host
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.hgx_h100())

    node = nvml.discover("hgx-1", host=host)

    lanes = tuple(tuple(0 if i == j else 18 for j in range(8)) for i in range(8))
    uniform = Topology.uniform(8, L.NVSWITCH, numa=[0, 0, 0, 0, 1, 1, 1, 1])
    assert node == Node(
        name="hgx-1",
        gpus=tuple(
            GPU(index=i, model="H100-80GB", memory_mib=81559, uuid=f"GPU-h100-{i}")
            for i in range(8)
        ),
        cpu_milli=32_000,
        memory_mib=512 * 1024,
        topology=Topology(links=uniform.links, numa=uniform.numa, nvlink_lanes=lanes),
        mig_reconfigurable=True,
    )


def test_a100_mig_instances_placements_uuids_and_nvlink_pairs(
    monkeypatch: pytest.MonkeyPatch, host: nvml.Host
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.a100_mig())

    node = nvml.discover("a100-1", host=host)

    assert node.gpus[0] == GPU(
        index=0,
        model="A100-80GB",
        memory_mib=81920,
        uuid="GPU-a100-0",
        mig_enabled=True,
        mig_layout=(
            MigInstance("2g.20gb", 0, "MIG-a100-0-2g"),
            MigInstance("1g.10gb", 2, "MIG-a100-0-1g-a"),
            MigInstance("1g.10gb", 3, "MIG-a100-0-1g-b"),
            MigInstance("3g.40gb", 4, "MIG-a100-0-3g"),
        ),
    )
    # MIG mode on, no instances created yet.
    assert node.gpus[1].mig_enabled
    assert node.gpus[1].mig_layout == ()
    assert not node.gpus[2].mig_enabled
    assert node.topology is not None
    # 0-1 and 2-3 bridged (12 links counted from both ends); pairs across sockets are SYS.
    assert [node.topology.link(0, j) for j in (1, 2, 3)] == [
        L.NVLINK,
        L.CROSS_SOCKET,
        L.CROSS_SOCKET,
    ]
    assert node.topology.link(2, 3) is L.NVLINK
    assert node.topology.nvlink_lanes[0][1] == 12
    assert node.topology.nvlink_lanes[2][3] == 12
    assert node.topology.nvlink_lanes[1][2] == 0
    assert node.topology.numa == (0, 0, 1, 1)


def test_t4_numa_from_cpu_affinity_when_the_driver_has_no_numa_ids(
    monkeypatch: pytest.MonkeyPatch, host: nvml.Host
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.t4_two_sockets())

    node = nvml.discover("t4-1", host=host)

    assert [g.model for g in node.gpus] == ["T4", "T4"]
    assert node.topology == Topology(
        links=((L.SAME_PCIE_SWITCH, L.CROSS_SOCKET), (L.CROSS_SOCKET, L.SAME_PCIE_SWITCH)),
        numa=(0, 1),
    )
    assert not node.mig_reconfigurable


@pytest.mark.parametrize(
    ("driver", "detail"),
    [(Driver.MISSING, "NVML Shared Library Not Found"), (Driver.NOT_LOADED, "Driver Not Loaded")],
)
def test_no_driver_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, host: nvml.Host, driver: Driver, detail: str
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.no_driver(driver))

    with pytest.raises(nvml.NoDriver) as info:
        nvml.discover("x", host=host)

    assert info.value.message == f"no NVIDIA driver found: {detail}"


def test_nvml_is_shut_down_after_discovery(
    monkeypatch: pytest.MonkeyPatch, host: nvml.Host
) -> None:
    machine = fake_nvml.hgx_h100()
    lib = fake_nvml.install(monkeypatch, machine)

    nvml.discover("hgx-1", host=host)

    assert not lib.initialized
    assert machine.calls[-1] == "nvmlShutdown"


def test_cli_prints_the_annotation_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.a100_mig())

    assert nvml.main(["--json", "--name", "gpu-box"]) == 0

    doc = json.loads(capsys.readouterr().out)
    assert doc["node"]["name"] == "gpu-box"
    assert doc["gpus"][0]["mig"][0] == {"profile": "2g.20gb", "start": 0, "uuid": "MIG-a100-0-2g"}
    # What the agent prints is what the Kubernetes source reads back.
    report = annotation.decode(json.dumps(doc))
    assert report.gpus[0].mig_layout[3] == MigInstance("3g.40gb", 4, "MIG-a100-0-3g")


def test_cli_without_driver_exits_2_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.no_driver())

    assert nvml.main([]) == 2

    assert capsys.readouterr().err.strip() == (
        "no NVIDIA driver found: NVML Shared Library Not Found"
    )


def test_cli_summary(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.hgx_h100())

    assert nvml.main(["--name", "hgx-1"]) == 0

    out = capsys.readouterr().out
    assert out.startswith("hgx-1: 8 GPU(s)")
    assert "GPU 7: H100-80GB 81559 MiB GPU-h100-7" in out
