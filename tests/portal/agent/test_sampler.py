"""NVML sampling through the real pynvml wrappers over the fake NVML C library."""

from __future__ import annotations

import pytest

from portal.agent.attribution import Attribution
from portal.agent.sampler import NvmlSampler
from portal.inventory import nvml
from portal.telemetry.wire import GpuSample, ProcessSample
from tests.support import fake_nvml
from tests.support.fake_nvml import Driver, FakeMachine, FakeProcess

MIB = 1024 * 1024


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def by_pid(pid: int) -> Attribution | None:
    """Processes 100-199 belong to workload w<pid>; the others to nobody."""
    return Attribution(workload_id=f"w{pid}") if 100 <= pid < 200 else None


def opened(
    monkeypatch: pytest.MonkeyPatch, machine: FakeMachine, clock: Clock | None = None
) -> NvmlSampler:
    fake_nvml.install(monkeypatch, machine)
    node = nvml.discover("n1")
    sampler = NvmlSampler(node, by_pid, clock=clock or Clock())
    sampler.open()
    return sampler


def test_whole_gpu_sample_reads_every_counter_and_attributes_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.t4_two_sockets()
    usage = machine.gpus[1].usage
    usage.gpu_pct, usage.memory_pct, usage.memory_used_mib = 64, 20, 3000
    usage.power_mw, usage.temperature_c, usage.throttle_reasons = 61_500, 71, 0x20
    usage.ecc_uncorrected, usage.pcie_tx_kib_s, usage.pcie_rx_kib_s = 2, 100, 300
    # Two processes of two workloads (per-process SM time from the driver) and a system one.
    usage.processes = (
        FakeProcess(101, 1000, sm_pct=40),
        FakeProcess(102, 1500, sm_pct=24),
        FakeProcess(7, 500, sm_pct=0),
    )
    sampler = opened(monkeypatch, machine)

    samples = sampler.sample()
    sampler.close()

    assert samples[1] == GpuSample(
        gpu_uuid="GPU-t4-1",
        at=1_800_000_000.0,
        utilization_pct=64,
        memory_used_mib=3000,
        memory_total_mib=15360,
        power_w=61.5,
        temperature_c=71,
        throttle_reasons=0x20,
        ecc_uncorrectable=2,
        pcie_tx_bytes_s=100 * 1024,
        pcie_rx_bytes_s=300 * 1024,
        processes=[
            ProcessSample(pid=101, workload_id="w101", memory_used_mib=1000, sm_util_pct=40),
            ProcessSample(pid=102, workload_id="w102", memory_used_mib=1500, sm_util_pct=24),
        ],
    )
    # The idle GPU: zero utilization, no processes, and no NVLink on a T4.
    assert samples[0].utilization_pct == 0
    assert samples[0].processes == []
    assert samples[0].nvlink_tx_bytes_s is None


def test_ecc_unsupported_reads_zero_and_processes_without_sm_samples_have_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.t4_two_sockets()
    machine.gpus[0].usage.ecc_uncorrected = None
    machine.gpus[0].usage.processes = (FakeProcess(150, 800),)
    sampler = opened(monkeypatch, machine)

    sample = sampler.sample()[0]
    sampler.close()

    assert sample.ecc_uncorrectable == 0
    assert sample.processes == [
        ProcessSample(pid=150, workload_id="w150", memory_used_mib=800, sm_util_pct=None)
    ]


def test_xid_events_are_counted_per_gpu_with_the_last_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.t4_two_sockets()
    sampler = opened(monkeypatch, machine)
    assert [s.xid_count for s in sampler.sample()] == [0, 0]

    machine.gpus[1].usage.xids.extend([13, 79])
    first = sampler.sample()
    machine.gpus[1].usage.xids.append(48)
    second = sampler.sample()
    sampler.close()

    assert [(s.xid_count, s.last_xid) for s in first] == [(0, None), (2, 79)]
    assert [(s.xid_count, s.last_xid) for s in second] == [(0, None), (3, 48)]


def test_nvlink_throughput_is_the_rate_between_two_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.hgx_h100()
    clock = Clock()
    sampler = opened(monkeypatch, machine, clock)
    usage = machine.gpus[0].usage
    usage.nvlink_tx_kib, usage.nvlink_rx_kib = 1_000, 5_000
    first = sampler.sample()[0]

    clock.t += 10
    usage.nvlink_tx_kib, usage.nvlink_rx_kib = 1_000 + 10 * 2_048, 5_000 + 10 * 512
    second = sampler.sample()[0]
    clock.t += 10
    usage.nvlink_tx_kib = 0  # counters reset (driver reload): no rate rather than a negative one
    third = sampler.sample()[0]
    sampler.close()

    assert (first.nvlink_tx_bytes_s, first.nvlink_rx_bytes_s) == (None, None)
    assert (second.nvlink_tx_bytes_s, second.nvlink_rx_bytes_s) == (2_048 * 1024, 512 * 1024)
    assert third.nvlink_tx_bytes_s is None


def test_mig_instances_report_gpm_activity_memory_and_their_own_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.h100_mig()
    gpu0 = machine.gpus[0]
    gpu0.usage.power_mw, gpu0.usage.temperature_c = 300_000, 60
    gpu0.instances[0].usage.activity_pct = 80.0
    gpu0.instances[0].usage.memory_used_mib = 12_000
    gpu0.instances[1].usage.activity_pct = 10.0
    gpu0.usage.processes = (FakeProcess(110, 12_000, instance=0), FakeProcess(120, 900, instance=1))
    sampler = opened(monkeypatch, machine)

    parent, a, b, whole = sampler.sample()
    sampler.close()

    # Two 3-slice instances of a 7-slice GPU: (80 * 3 + 10 * 3) / 7.
    assert parent.gpu_instance_id is None
    assert parent.utilization_pct == pytest.approx(270 / 7)
    assert (parent.power_w, parent.temperature_c) == (300.0, 60)
    assert a == GpuSample(
        gpu_uuid="GPU-h100m-0",
        gpu_instance_id=1,
        mig_uuid="MIG-h100-0-a",
        at=a.at,
        utilization_pct=80.0,
        activity_pct=80.0,
        memory_used_mib=12_000,
        memory_total_mib=40192,
        processes=[ProcessSample(pid=110, workload_id="w110", memory_used_mib=12_000)],
    )
    assert (b.gpu_instance_id, b.utilization_pct) == (2, 10.0)
    assert [p.workload_id for p in b.processes] == ["w120"]
    assert whole.gpu_uuid == "GPU-h100m-1" and whole.gpu_instance_id is None


def test_mig_gpu_without_gpm_sends_its_health_and_instance_memory_without_utilization(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.a100_mig()  # A100: MIG on GPUs 0 and 1, no GPM
    gpu0 = machine.gpus[0]
    gpu0.usage.memory_used_mib, gpu0.usage.power_mw, gpu0.usage.temperature_c = 30_000, 250_000, 83
    gpu0.usage.throttle_reasons, gpu0.usage.ecc_uncorrected = 0x40, 1
    gpu0.usage.pcie_tx_kib_s = 10
    gpu0.usage.xids.append(48)
    gpu0.instances[0].usage.memory_used_mib = 20_000  # the 3g.40gb, GPU instance 1
    gpu0.usage.processes = (FakeProcess(130, 20_000, instance=0),)
    machine.gpus[2].usage.gpu_pct = 33
    sampler = opened(monkeypatch, machine)

    samples = sampler.sample()
    sampler.close()

    assert [(s.device, s.utilization_pct) for s in samples] == [
        ("GPU-a100-0", None),
        ("GPU-a100-0/gi1", None),
        ("GPU-a100-0/gi2", None),
        ("GPU-a100-0/gi3", None),
        ("GPU-a100-0/gi4", None),
        ("GPU-a100-1", None),  # MIG mode without instances: its health still counts
        ("GPU-a100-2", 33),
        ("GPU-a100-3", 0),
    ]
    parent, big = samples[0], samples[1]
    assert parent == GpuSample(
        gpu_uuid="GPU-a100-0",
        at=parent.at,
        utilization_pct=None,
        memory_used_mib=30_000,
        memory_total_mib=81920,
        power_w=250.0,
        temperature_c=83,
        throttle_reasons=0x40,
        xid_count=1,
        last_xid=48,
        ecc_uncorrectable=1,
        pcie_tx_bytes_s=10 * 1024,
        pcie_rx_bytes_s=0,
    )
    assert big == GpuSample(
        gpu_uuid="GPU-a100-0",
        gpu_instance_id=1,
        mig_uuid="MIG-a100-0-3g",
        at=big.at,
        utilization_pct=None,
        activity_pct=None,
        memory_used_mib=20_000,
        memory_total_mib=40192,  # the 3g.40gb profile's memory
        processes=[ProcessSample(pid=130, workload_id="w130", memory_used_mib=20_000)],
    )


def test_a_gpm_instance_without_a_reading_is_unmeasured_and_so_is_its_gpus_sum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.h100_mig()
    gpu0 = machine.gpus[0]
    gpu0.instances[0].usage.activity_pct = 80.0
    gpu0.instances[1].usage.gpm_fails = True
    gpu0.usage.temperature_c = 61
    sampler = opened(monkeypatch, machine)

    parent, a, b, _whole = sampler.sample()
    gpu0.instances[1].usage.gpm_fails = False  # readable again: the sum is known again
    again = sampler.sample()[0]
    sampler.close()

    assert [(s.device, s.utilization_pct) for s in (parent, a, b)] == [
        ("GPU-h100m-0", None),  # not (80 x 3 + 0 x 3) / 7
        ("GPU-h100m-0/gi1", 80.0),
        ("GPU-h100m-0/gi2", None),
    ]
    assert parent.temperature_c == 61
    assert again.utilization_pct == pytest.approx(240 / 7)


def test_a_gpu_replaced_since_discovery_is_an_error_naming_both_uuids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = fake_nvml.t4_two_sockets()
    fake_nvml.install(monkeypatch, machine)
    node = nvml.discover("n1")
    machine.gpus[0].uuid = "GPU-t4-new"

    with pytest.raises(nvml.NvmlError, match="GPU 0 is GPU-t4-new now, discovery saw GPU-t4-0"):
        NvmlSampler(node, by_pid).open()
    # NVML was shut down again: a new sampler can start.
    machine.gpus[0].uuid = "GPU-t4-0"
    NvmlSampler(node, by_pid).open()


def test_no_driver_at_open_is_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = fake_nvml.t4_two_sockets()
    fake_nvml.install(monkeypatch, machine)
    node = nvml.discover("n1")
    machine.driver = Driver.NOT_LOADED

    with pytest.raises(nvml.NoDriver, match="no NVIDIA driver found"):
        NvmlSampler(node, by_pid).open()


def test_sampling_a_closed_sampler_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = opened(monkeypatch, fake_nvml.t4_two_sockets())
    sampler.close()
    with pytest.raises(nvml.NvmlError, match="not open"):
        sampler.sample()
