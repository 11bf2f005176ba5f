"""The Prometheus source against a real Prometheus server scraping a DCGM-format exporter.

The exporter's text is derived from the same fixture machine the fake NVML serves, so the node
agent (NVML) and the Prometheus source (DCGM) measure the same devices and workloads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from portal.agent.attribution import PodRef, ProcessAttributor
from portal.agent.sampler import NvmlSampler
from portal.inventory import nvml
from portal.telemetry.prometheus import PrometheusError, PrometheusSource, query
from portal.telemetry.wire import GpuSample, SampleBatch, Source
from tests.support import dcgm_exporter, fake_nvml
from tests.support.fake_nvml import FakeMachine, FakeProcess
from tests.support.prometheus import running_prometheus

HOST = "gpu-node-1"
# pid -> (namespace, pod, container) and the pod UIDs their cgroups carry
PODS = {
    101: ("gp-team-a", "train-resnet-0", "main"),
    110: ("gp-team-a", "jupyter-alice", "notebook"),
    120: ("gp-team-b", "jupyter-bob", "notebook"),
}
UIDS = {pid: f"00000000-0000-4000-8000-{pid:012d}" for pid in PODS}


def machine_with_workloads() -> FakeMachine:
    """GPU 0 in MIG mode with one pod per instance, GPU 1 whole with one pod; an XID pending."""
    machine = fake_nvml.h100_mig()
    mig_gpu, whole = machine.gpus
    mig_gpu.usage.power_mw, mig_gpu.usage.temperature_c = 280_000, 58
    mig_gpu.usage.processes = (
        FakeProcess(110, 12_000, instance=0),
        FakeProcess(120, 3_000, instance=1),
    )
    mig_gpu.instances[0].usage.activity_pct = 55.0
    mig_gpu.instances[0].usage.memory_used_mib = 12_000
    mig_gpu.instances[1].usage.activity_pct = 20.0
    mig_gpu.instances[1].usage.memory_used_mib = 3_000
    u = whole.usage
    u.gpu_pct, u.memory_used_mib, u.power_mw, u.temperature_c = 72, 20_000, 350_000, 66
    u.throttle_reasons, u.ecc_uncorrected = 0x4, 1
    u.processes = (FakeProcess(101, 20_000, sm_pct=72),)
    u.xids.append(79)
    return machine


def proc_tree(root: Path) -> Path:
    for pid, uid in UIDS.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/c0ffee\n")
        (d / "status").write_text("PPid:\t1\n")
    return root


def per_workload_utilization(batches: list[SampleBatch]) -> dict[tuple[str, str], float]:
    """Each pod's utilization: that of the device (GPU or MIG instance) it alone uses."""
    out: dict[tuple[str, str], float] = {}
    for batch in batches:
        for s in batch.samples:
            pods = {(p.namespace or "", p.pod or "") for p in s.processes}
            if len(pods) == 1:
                out[pods.pop()] = s.utilization_pct
    return out


def device_readings(batches: list[SampleBatch]) -> dict[str, tuple[object, ...]]:
    """What both sources measure of every device, keyed by the portal's device id."""
    return {
        s.device: (
            round(s.utilization_pct, 6),
            s.memory_used_mib,
            s.memory_total_mib,
            s.power_w,
            s.temperature_c,
            s.throttle_reasons,
            s.ecc_uncorrectable,
            s.xid_count,
            s.last_xid,
        )
        for b in batches
        for s in b.samples
    }


def wait_for(
    poll: Callable[[], list[SampleBatch]], ready: Callable[[list[SampleBatch]], bool]
) -> list[SampleBatch]:
    deadline = time.monotonic() + 30
    while True:
        got = poll()
        if ready(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus never had the expected series; last: {got}")
        time.sleep(0.5)


@pytest.fixture
def prometheus_of(tmp_path: Path) -> Iterator[Callable[[Callable[[], str]], str]]:
    """Starts an exporter serving the given text and a Prometheus scraping it; both stop."""
    from contextlib import ExitStack

    with ExitStack() as stack:

        def start(text: Callable[[], str]) -> str:
            target = stack.enter_context(dcgm_exporter.serve(text))
            return stack.enter_context(running_prometheus(tmp_path / "prom", [target]))

        yield start


def test_prometheus_path_gives_the_same_per_workload_utilization_as_the_nvml_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, prometheus_of: Callable[..., str]
) -> None:
    machine = machine_with_workloads()
    text = dcgm_exporter.exposition(machine, HOST, PODS)
    url = prometheus_of(lambda: text)

    # NVML path: the agent's sampler over the fake NVML, processes → pods through /proc.
    fake_nvml.install(monkeypatch, machine)
    node = nvml.discover(HOST)
    pods = {UIDS[pid]: PodRef(ns, pod) for pid, (ns, pod, _) in PODS.items()}
    sampler = NvmlSampler(node, ProcessAttributor(proc_tree(tmp_path / "proc"), pods.get))
    sampler.open()
    nvml_batches = [SampleBatch(node=HOST, source=Source.NVML, samples=sampler.sample())]
    sampler.close()

    # Prometheus path: the real server's query API over what it scraped.
    with httpx.Client(base_url=url, timeout=10) as client:
        source = PrometheusSource(client, hostname=HOST)
        dcgm_batches = wait_for(source.batches, lambda b: sum(len(x.samples) for x in b) == 4)

    expected = {
        ("gp-team-a", "train-resnet-0"): 72.0,
        ("gp-team-a", "jupyter-alice"): 55.0,
        ("gp-team-b", "jupyter-bob"): 20.0,
    }
    assert per_workload_utilization(nvml_batches) == expected
    assert per_workload_utilization(dcgm_batches) == expected
    assert [(b.node, b.source) for b in dcgm_batches] == [(HOST, Source.DCGM)]
    # Beyond utilization, every device reads the same through both paths: memory, power,
    # temperature, throttling, ECC and the XID (a count of 1, last code 79).
    assert device_readings(dcgm_batches) == device_readings(nvml_batches)
    assert device_readings(nvml_batches)["GPU-h100m-1"][-2:] == (1, 79)
    # The MIG parent: (55 * 3 + 20 * 3) / 7 from the instances in both.
    assert device_readings(dcgm_batches)["GPU-h100m-0"][0] == round(225 / 7, 6)


def test_xid_codes_are_counted_as_they_change_between_polls(
    prometheus_of: Callable[..., str],
) -> None:
    machine = fake_nvml.t4_two_sockets()
    machine.gpus[0].usage.gpu_pct = 10
    current = {"text": dcgm_exporter.exposition(machine, HOST, {})}
    url = prometheus_of(lambda: current["text"])

    def xid_of(batches: list[SampleBatch]) -> tuple[int, int | None] | None:
        gpu0 = [s for b in batches for s in b.samples if s.gpu_uuid == "GPU-t4-0"]
        return (gpu0[0].xid_count, gpu0[0].last_xid) if gpu0 else None

    with httpx.Client(base_url=url, timeout=10) as client:
        source = PrometheusSource(client, lookback_s=2)
        seen = []
        for code in (0, 79, 79, 48):
            machine.gpus[0].usage.xids[:] = [code] if code else []
            current["text"] = dcgm_exporter.exposition(machine, HOST, {})
            want_last = code or None

            def shows(b: list[SampleBatch], want: int | None = want_last) -> bool:
                return (xid_of(b) or (0, -1))[1] == want

            seen.append(xid_of(wait_for(source.batches, shows)))

    # 79 stays the last code on the second poll: still one XID; 48 is the second.
    assert seen == [(0, None), (1, 79), (1, 79), (2, 48)]


def test_prometheus_without_dcgm_series_gives_no_batches(
    prometheus_of: Callable[..., str],
) -> None:
    url = prometheus_of(lambda: "# nothing here\n")
    with httpx.Client(base_url=url, timeout=10) as client:
        assert PrometheusSource(client).batches() == []


def test_a_server_that_is_not_prometheus_and_an_unreachable_one_are_prometheus_errors() -> None:
    with (
        dcgm_exporter.serve(lambda: "") as not_prometheus,
        httpx.Client(base_url=f"http://{not_prometheus}", timeout=10) as client,
        pytest.raises(PrometheusError, match="Prometheus answered 404 to"),
    ):
        PrometheusSource(client).batches()
    with (
        httpx.Client(base_url="http://127.0.0.1:9", timeout=2) as client,
        pytest.raises(PrometheusError, match="Prometheus unreachable"),
    ):
        PrometheusSource(client).batches()


def test_query_names_every_metric_and_the_node() -> None:
    q = query(60, "gpu-node-1")
    assert q.startswith('{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE|')
    assert q.endswith(',Hostname="gpu-node-1"}[60s]')


def test_sample_values_from_the_exporter_text_are_wire_samples(
    prometheus_of: Callable[..., str],
) -> None:
    machine = fake_nvml.t4_two_sockets()
    machine.gpus[1].usage.gpu_pct, machine.gpus[1].usage.memory_used_mib = 40, 1024
    url = prometheus_of(lambda: dcgm_exporter.exposition(machine, "t4-node", {}))
    with httpx.Client(base_url=url, timeout=10) as client:
        batches = wait_for(
            PrometheusSource(client).batches, lambda b: sum(len(x.samples) for x in b) == 2
        )
    sample = batches[0].samples[1]
    assert sample == GpuSample(
        gpu_uuid="GPU-t4-1",
        at=sample.at,
        utilization_pct=40,
        memory_used_mib=1024,
        memory_total_mib=15360,
        power_w=0,
        temperature_c=0,
        xid_count=0,
    )
    assert abs(sample.at - time.time()) < 30  # the scrape time, not the query's
