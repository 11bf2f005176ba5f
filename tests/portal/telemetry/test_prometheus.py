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

from policies.flavors import FlavorKind
from policies.inventory import Node
from policies.requests import DeviceRequest, WorkloadRequest
from portal.agent.attribution import PodRef, ProcessAttributor
from portal.agent.reporter import Reporter
from portal.agent.run import Agent, NvmlSource
from portal.agent.sampler import NvmlSampler
from portal.allocator import Allocator
from portal.cli import run
from portal.inventory import nvml
from portal.store.writer import Store
from portal.telemetry.prometheus import PrometheusError, PrometheusSource, query
from portal.telemetry.wire import GpuSample, SampleBatch, Source
from tests.portal.allocator.conftest import ManualClock
from tests.support import dcgm_exporter, fake_nvml
from tests.support.fake_nvml import FakeMachine, FakeProcess
from tests.support.portal_server import serve
from tests.support.ports import free_port
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


def per_workload_utilization(batches: list[SampleBatch]) -> dict[tuple[str, str], float | None]:
    """Each pod's utilization: that of the device (GPU or MIG instance) it alone uses."""
    out: dict[tuple[str, str], float | None] = {}
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
            None if s.utilization_pct is None else round(s.utilization_pct, 6),
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


def portal_with_two_notebooks(db: Path, node: Node) -> tuple[Store, Allocator, list[str]]:
    """A portal over ``node`` (two T4s) with one whole-GPU notebook per GPU."""
    store = Store(f"sqlite:///{db}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([node])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", "T4", guaranteed=2, limit=2)
    request = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"T4"}))
    ids = [alloc.request(WorkloadRequest("team-a", u, "nb", request)).id for u in ("ann", "ben")]
    return store, alloc, ids


def stored_utilization(base: str, workloads: list[str]) -> dict[str, list[float]]:
    out = {}
    for i, w in enumerate(workloads):
        r = httpx.get(
            f"{base}/api/v1/telemetry/series",
            params={"workload_id": w, "resolution": "raw", "start": time.time() - 600},
            headers={"Authorization": "token ops"},
        )
        assert r.status_code == 200, r.text
        out[f"workload {i}"] = [p["utilization_avg"] for p in r.json()["series"][0]["points"]]
    return out


def test_through_the_portal_both_paths_store_the_same_per_workload_utilization(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, prometheus_of: Callable[..., str]
) -> None:
    machine = fake_nvml.t4_two_sockets()
    fake_nvml.install(monkeypatch, machine)
    node = nvml.discover("t4-node")
    nvml_portal = portal_with_two_notebooks(tmp_path / "nvml.db", node)
    dcgm_portal = portal_with_two_notebooks(tmp_path / "dcgm.db", node)
    placed = [nvml_portal[1].status(w).allocations[0].gpu_uuids for w in nvml_portal[2]]
    assert placed == [dcgm_portal[1].status(w).allocations[0].gpu_uuids for w in dcgm_portal[2]]
    index = {g.uuid: g.index for g in node.gpus}
    pods = {}
    for k, (uuids, util) in enumerate(zip(placed, (83, 7), strict=True)):
        usage = machine.gpus[index[uuids[0]]].usage
        usage.gpu_pct, usage.memory_used_mib = util, 1000 * (k + 1)
        usage.processes = (FakeProcess(200 + k, 1000 * (k + 1)),)
        pods[200 + k] = ("gp-team-a", f"jupyter-{('ann', 'ben')[k]}", "notebook")
    text = dcgm_exporter.exposition(machine, "t4-node", pods)
    url = prometheus_of(lambda: text)

    try:
        with serve(nvml_portal[1], free_port()) as base, httpx.Client(base_url=base) as client:
            reporter = Reporter(client, "agent")
            source = NvmlSource("t4-node", ProcessAttributor(tmp_path / "no-proc"))
            Agent(source, reporter.submit, reporter.flush).tick()
            source.close()
            from_nvml = stored_utilization(base, nvml_portal[2])
        with (
            serve(dcgm_portal[1], free_port()) as base,
            httpx.Client(base_url=base) as client,
            httpx.Client(base_url=url, timeout=10) as prom,
        ):
            prometheus = PrometheusSource(prom)
            wait_for(prometheus.batches, lambda b: sum(len(x.samples) for x in b) == 2)
            reporter = Reporter(client, "agent")
            Agent(prometheus, reporter.submit, reporter.flush).tick()
            assert reporter.stats.last_result is not None
            assert reporter.stats.last_result.accepted == 2
            from_dcgm = stored_utilization(base, dcgm_portal[2])
    finally:
        for store, _, _ in (nvml_portal, dcgm_portal):
            store.close()

    assert from_nvml == {"workload 0": [83.0], "workload 1": [7.0]}
    assert from_dcgm == from_nvml


def test_the_agent_command_reads_prometheus_instead_of_nvml(
    capsys: pytest.CaptureFixture[str], prometheus_of: Callable[..., str]
) -> None:
    machine = fake_nvml.t4_two_sockets()
    machine.gpus[0].usage.gpu_pct = 31
    url = prometheus_of(lambda: dcgm_exporter.exposition(machine, "t4-node", {}))
    with httpx.Client(base_url=url, timeout=10) as client:
        wait_for(PrometheusSource(client).batches, lambda b: bool(b))

    assert run(["agent", "--prometheus", url, "--stdout", "--once", "--node", "t4-node"]) == 0

    batch = SampleBatch.model_validate_json(capsys.readouterr().out)
    assert (batch.node, batch.source) == ("t4-node", Source.DCGM)
    assert [(s.gpu_uuid, s.utilization_pct) for s in batch.samples] == [
        ("GPU-t4-0", 31),
        ("GPU-t4-1", 0),
    ]


def test_unusable_series_are_skipped_and_the_rest_still_read(
    prometheus_of: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    def series(name: str, uuid: str, value: str, **extra: str) -> str:
        labels = {"gpu": "0", "UUID": uuid, "Hostname": "n1", **extra}
        pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{name}{{{pairs}}} {value}"

    text = (
        "\n".join(
            [
                # a good GPU, attributed through federation-style exported_* labels
                series(
                    "DCGM_FI_DEV_GPU_UTIL",
                    "GPU-good",
                    "12",
                    exported_namespace="ns",
                    exported_pod="p1",
                    namespace="monitoring",
                    pod="dcgm-exporter-x",
                ),
                series("DCGM_FI_DEV_FB_USED", "GPU-good", "10"),
                series("DCGM_FI_DEV_FB_FREE", "GPU-good", "90"),
                # utilization above 100: refused by the wire format, skipped
                series("DCGM_FI_DEV_GPU_UTIL", "GPU-hot", "250"),
                series("DCGM_FI_DEV_FB_USED", "GPU-hot", "1"),
                series("DCGM_FI_DEV_FB_FREE", "GPU-hot", "1"),
                # NaN utilization: as if absent, so not measured (memory still sent)
                series("DCGM_FI_DEV_GPU_UTIL", "GPU-nan", "NaN"),
                series("DCGM_FI_DEV_FB_USED", "GPU-nan", "1"),
                series("DCGM_FI_DEV_FB_FREE", "GPU-nan", "1"),
                # no framebuffer series
                series("DCGM_FI_DEV_GPU_UTIL", "GPU-nofb", "5"),
                # no UUID label at all
                'DCGM_FI_DEV_GPU_UTIL{gpu="3",Hostname="n1"} 50',
            ]
        )
        + "\n"
    )
    url = prometheus_of(lambda: text)
    with httpx.Client(base_url=url, timeout=10) as client:
        batches = wait_for(PrometheusSource(client).batches, bool)

    assert len(batches) == 1
    good, unmeasured = batches[0].samples
    assert (good.gpu_uuid, good.utilization_pct, good.memory_total_mib) == ("GPU-good", 12, 100)
    assert [(p.namespace, p.pod) for p in good.processes] == [("ns", "p1")]
    assert (unmeasured.gpu_uuid, unmeasured.utilization_pct) == ("GPU-nan", None)
    assert (unmeasured.memory_used_mib, unmeasured.memory_total_mib) == (1, 2)
    for skipped in ("GPU-hot", "GPU-nofb"):
        assert f"n1/{skipped}/None" in caplog.text
    assert "GPU-nan" not in caplog.text


def test_a_mig_gpu_without_engine_activity_is_sent_unmeasured_with_its_health(
    prometheus_of: Callable[..., str],
) -> None:
    # An A100 in MIG mode whose exporter has no profiling metrics: no GPU_UTIL (MIG mode) and
    # no GR_ENGINE_ACTIVE; its memory, temperature and ECC, and the instance's memory, remain.
    def series(name: str, value: str, **extra: str) -> str:
        labels = {"gpu": "0", "UUID": "GPU-a100", "Hostname": "n1", **extra}
        labels["modelName"] = "NVIDIA A100 80GB PCIe"
        pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{name}{{{pairs}}} {value}"

    instance = {"GPU_I_ID": "1", "GPU_I_PROFILE": "3g.40gb", "namespace": "ns", "pod": "nb"}
    text = "\n".join(
        [
            series("DCGM_FI_DEV_FB_USED", "21000"),
            series("DCGM_FI_DEV_FB_FREE", "60920"),
            series("DCGM_FI_DEV_GPU_TEMP", "83"),
            series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2"),
            series("DCGM_FI_DEV_FB_USED", "20000", **instance),
            series("DCGM_FI_DEV_FB_FREE", "20192", **instance),
        ]
    )
    url = prometheus_of(lambda: text + "\n")
    with httpx.Client(base_url=url, timeout=10) as client:
        batches = wait_for(
            PrometheusSource(client).batches, lambda b: sum(len(x.samples) for x in b) == 2
        )

    gpu, mig = batches[0].samples
    assert (gpu.device, gpu.utilization_pct, gpu.activity_pct) == ("GPU-a100", None, None)
    assert (gpu.memory_used_mib, gpu.temperature_c, gpu.ecc_uncorrectable) == (21000, 83, 2)
    assert (mig.device, mig.utilization_pct, mig.memory_used_mib) == ("GPU-a100/gi1", None, 20000)
    assert [(p.namespace, p.pod) for p in mig.processes] == [("ns", "nb")]
