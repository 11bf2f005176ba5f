"""Samples this host's GPUs and MIG instances with NVML, as wire-format ``GpuSample``s.

What NVML gives, and where:

- whole GPUs: utilization (``nvmlDeviceGetUtilizationRates``), memory, power, temperature,
  clocks-event (throttle) reasons, volatile uncorrectable ECC errors, PCIe throughput (KB/s over
  NVML's own short window), NVLink data throughput (from the cumulative
  ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_*`` counters, as a rate between two samples), XID errors
  (critical-XID events, counted since the agent started), the compute processes with their
  memory and, where the driver keeps them, per-process SM utilization;
- MIG instances: NVML has no utilization counter for them; on GPUs with GPU Performance
  Monitoring (Hopper and later) the graphics-engine activity of each GPU instance between two
  samples (``NVML_GPM_METRIC_GRAPHICS_UTIL``, the same quantity as DCGM's
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``) is the instance's utilization. Memory and processes come
  from the MIG device handle. Without GPM (A100, A30) an instance is sent with its memory and
  processes and no utilization (``None``: not measured, which is not 0 %);
- a MIG-mode GPU's own sample carries memory, power, temperature, throttling, ECC, XID, PCIe
  and NVLink, with the utilization its instances' activity adds up to (each weighted by its
  compute slices), or none when an instance's activity is not measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pynvml

from policies import mig
from policies.inventory import GPU, Node
from portal.agent.attribution import Attribution
from portal.inventory.nvml import NoDriver, NvmlError
from portal.telemetry.wire import GpuSample, ProcessSample

log = logging.getLogger(__name__)

T = TypeVar("T")
MIB = 1024 * 1024
# Errors that mean "not offered here" (old driver, GPU without the feature, no data yet).
_UNAVAILABLE = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_InvalidArgument,
    pynvml.NVMLError_NotFound,
    pynvml.NVMLError_NoPermission,
)
_NVLINK_FIELDS = [
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),  # scope: all links
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
]

Attributor = Callable[[int], Attribution | None]


def _optional(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except _UNAVAILABLE:
        return None


@dataclass
class _Instance:
    """A MIG instance being sampled, with its two alternating GPM samples."""

    gpu_instance_id: int
    uuid: str
    slices: int
    handle: Any
    gpm: list[Any] = field(default_factory=list)


@dataclass
class _Gpu:
    index: int
    uuid: str
    handle: Any
    mig_enabled: bool
    total_slices: int
    instances: list[_Instance]
    gpm: bool = False
    xid_count: int = 0
    last_xid: int | None = None
    process_seen_us: int = 0
    nvlink: tuple[float, int, int] | None = None  # (time, tx KiB, rx KiB) of the last sample


class NvmlSampler:
    """Samples the GPUs of a discovered ``Node``; NVML stays initialized between samples.

    ``open()`` before the first ``sample()``, ``close()`` at the end (also after errors).
    """

    def __init__(self, node: Node, attribute: Attributor, clock: Callable[[], float] = time.time):
        self._node = node
        self._attribute = attribute
        self._clock = clock
        self._gpus: list[_Gpu] = []
        self._events: Any = None
        self._open = False

    def open(self) -> None:
        """Initialize NVML, find each GPU and MIG instance, arm XID events and GPM samples."""
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as e:
            raise NoDriver(f"no NVIDIA driver found: {e}") from None
        except pynvml.NVMLError as e:
            raise NvmlError(f"NVML failed to start: {e}") from None
        self._open = True
        try:
            self._gpus = [self._prepare(gpu) for gpu in self._node.gpus]
            self._events = self._arm_events()
        except pynvml.NVMLError as e:
            self.close()
            raise NvmlError(f"NVML query failed: {e}") from None

    def close(self) -> None:
        if not self._open:
            return
        for gpu in self._gpus:
            for inst in gpu.instances:
                for sample in inst.gpm:
                    _optional(partial(pynvml.nvmlGpmSampleFree, sample))
        if self._events is not None:
            _optional(partial(pynvml.nvmlEventSetFree, self._events))
        self._gpus, self._events, self._open = [], None, False
        pynvml.nvmlShutdown()

    def _prepare(self, gpu: GPU) -> _Gpu:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        if gpu.uuid and uuid != gpu.uuid:
            raise NvmlError(
                f"GPU {gpu.index} is {uuid} now, discovery saw {gpu.uuid}; rediscover the node"
            )
        support = _optional(partial(pynvml.nvmlGpmQueryDeviceSupport, handle))
        state = _Gpu(
            index=gpu.index,
            uuid=uuid,
            handle=handle,
            mig_enabled=gpu.mig_enabled,
            total_slices=mig.geometry(gpu.model).compute_slices if gpu.mig_enabled else 0,
            instances=[],
            gpm=bool(support is not None and support.isSupportedDevice),
        )
        if gpu.mig_enabled:
            state.instances = self._instances(state, gpu)
        return state

    def _instances(self, state: _Gpu, gpu: GPU) -> list[_Instance]:
        geometry = mig.geometry(gpu.model)
        by_uuid = {i.uuid: i for i in gpu.mig_layout if i.uuid}
        found = []
        for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(state.handle)):
            dev = _optional(partial(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, state.handle, k))
            if dev is None:
                continue
            mig_uuid = pynvml.nvmlDeviceGetUUID(dev)
            layout = by_uuid.get(mig_uuid)
            if layout is None:
                continue  # created after discovery; the next rediscovery adds it
            inst = _Instance(
                gpu_instance_id=pynvml.nvmlDeviceGetGpuInstanceId(dev),
                uuid=mig_uuid,
                slices=geometry.profile(layout.profile).compute_slices,
                handle=dev,
            )
            if state.gpm:
                inst.gpm = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
                self._gpm_take(state, inst, inst.gpm[0])
            found.append(inst)
        return found

    def _arm_events(self) -> Any:
        events = _optional(pynvml.nvmlEventSetCreate)
        if events is None:
            log.info("NVML events are not available; XID counts stay 0")
            return None
        for gpu in self._gpus:
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    gpu.handle, pynvml.nvmlEventTypeXidCriticalError, events
                )
            except _UNAVAILABLE:
                log.info("GPU %s: XID events are not available; XID counts stay 0", gpu.uuid)
        return events

    # -- sampling ------------------------------------------------------------------------------
    def sample(self) -> list[GpuSample]:
        """One sample of every GPU and MIG instance NVML can measure now."""
        if not self._open:
            raise NvmlError("the sampler is not open")
        try:
            self._drain_xids()
            out: list[GpuSample] = []
            for gpu in self._gpus:
                out.extend(self._sample_gpu(gpu))
            return out
        except pynvml.NVMLError as e:
            raise NvmlError(f"NVML query failed: {e}") from None

    def _drain_xids(self) -> None:
        if self._events is None:
            return
        by_uuid = {g.uuid: g for g in self._gpus}
        while True:
            try:
                data = pynvml.nvmlEventSetWait(self._events, 0)
            except (pynvml.NVMLError_Timeout, *_UNAVAILABLE):
                return
            if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
                continue
            gpu = by_uuid.get(pynvml.nvmlDeviceGetUUID(data.device))
            if gpu is not None:
                gpu.xid_count += 1
                gpu.last_xid = int(data.eventData)

    def _sample_gpu(self, gpu: _Gpu) -> list[GpuSample]:
        at = self._clock()
        h = gpu.handle
        memory = pynvml.nvmlDeviceGetMemoryInfo(h)
        common: dict[str, Any] = {
            "gpu_uuid": gpu.uuid,
            "at": at,
            "power_w": _scaled(_optional(partial(pynvml.nvmlDeviceGetPowerUsage, h)), 1e-3),
            "temperature_c": _optional(
                partial(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            ),
            "throttle_reasons": _throttle_reasons(h),
            "xid_count": gpu.xid_count,
            "last_xid": gpu.last_xid,
            "ecc_uncorrectable": _optional(
                partial(
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    h,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    pynvml.NVML_VOLATILE_ECC,
                )
            )
            or 0,
            "pcie_tx_bytes_s": _pcie(h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_rx_bytes_s": _pcie(h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
            "memory_total_mib": memory.total / MIB,
        }
        common["nvlink_tx_bytes_s"], common["nvlink_rx_bytes_s"] = self._nvlink(gpu, at)
        if not gpu.mig_enabled:
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            return [
                GpuSample(
                    **common,
                    utilization_pct=util.gpu,
                    memory_used_mib=memory.used / MIB,
                    processes=self._processes(gpu, h, per_process_util=True),
                )
            ]
        out = []
        weighted: float | None = 0.0
        for inst in gpu.instances:
            activity = self._gpm_activity(gpu, inst)
            if activity is None:
                weighted = None  # one instance unmeasured: the GPU's sum is unknown too
            elif weighted is not None:
                weighted += activity * inst.slices
            inst_memory = pynvml.nvmlDeviceGetMemoryInfo(inst.handle)
            out.append(
                GpuSample(
                    gpu_uuid=gpu.uuid,
                    gpu_instance_id=inst.gpu_instance_id,
                    mig_uuid=inst.uuid,
                    at=at,
                    utilization_pct=activity,
                    activity_pct=activity,
                    memory_used_mib=inst_memory.used / MIB,
                    memory_total_mib=inst_memory.total / MIB,
                    processes=self._processes(gpu, inst.handle, per_process_util=False),
                )
            )
        parent_util = None
        if gpu.gpm and weighted is not None:
            parent_util = min(weighted / gpu.total_slices, 100.0) if gpu.total_slices else 0.0
        parent = GpuSample(**common, utilization_pct=parent_util, memory_used_mib=memory.used / MIB)
        return [parent, *out]

    def _processes(self, gpu: _Gpu, handle: Any, *, per_process_util: bool) -> list[ProcessSample]:
        procs = _optional(partial(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)) or []
        sm: dict[int, tuple[int, int]] = {}  # pid -> (timestamp us, SM %), the newest sample
        if per_process_util and procs:
            samples = _optional(
                partial(pynvml.nvmlDeviceGetProcessUtilization, handle, gpu.process_seen_us)
            )
            for s in samples or ():
                if s.pid not in sm or s.timeStamp > sm[s.pid][0]:
                    sm[s.pid] = (s.timeStamp, s.smUtil)
                gpu.process_seen_us = max(gpu.process_seen_us, s.timeStamp)
        out = []
        for p in procs:
            who = self._attribute(p.pid)
            if who is None:
                continue  # not a workload's (a system process, or not readable)
            out.append(
                ProcessSample(
                    pid=p.pid,
                    workload_id=who.workload_id,
                    namespace=who.namespace,
                    pod=who.pod,
                    user=who.user,
                    server=who.server,
                    memory_used_mib=(p.usedGpuMemory or 0) / MIB,
                    sm_util_pct=min(sm[p.pid][1], 100) if p.pid in sm else None,
                )
            )
        return out

    def _nvlink(self, gpu: _Gpu, at: float) -> tuple[float | None, float | None]:
        values = _optional(partial(pynvml.nvmlDeviceGetFieldValues, gpu.handle, _NVLINK_FIELDS))
        if values is None or any(v.nvmlReturn != pynvml.NVML_SUCCESS for v in values):
            return None, None
        tx, rx = int(values[0].value.ullVal), int(values[1].value.ullVal)
        previous, gpu.nvlink = gpu.nvlink, (at, tx, rx)
        if previous is None or at <= previous[0] or tx < previous[1] or rx < previous[2]:
            return None, None  # first sample, or the counters were reset
        seconds = at - previous[0]
        return (tx - previous[1]) * 1024 / seconds, (rx - previous[2]) * 1024 / seconds

    def _gpm_take(self, gpu: _Gpu, inst: _Instance, sample: Any) -> bool:
        try:
            pynvml.nvmlGpmMigSampleGet(gpu.handle, inst.gpu_instance_id, sample)
        except _UNAVAILABLE:
            return False
        return True

    def _gpm_activity(self, gpu: _Gpu, inst: _Instance) -> float | None:
        if not gpu.gpm or len(inst.gpm) != 2:
            return None
        before, after = inst.gpm
        if not self._gpm_take(gpu, inst, after):
            return None
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = before, after
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        inst.gpm.reverse()  # this sample is the start of the next interval
        got = _optional(partial(pynvml.nvmlGpmMetricsGet, request))
        if got is None or got.metrics[0].nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        return min(max(float(got.metrics[0].value), 0.0), 100.0)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _pcie(handle: Any, counter: int) -> float | None:
    kb_s = _optional(partial(pynvml.nvmlDeviceGetPcieThroughput, handle, counter))
    return None if kb_s is None else kb_s * 1024.0


def _throttle_reasons(handle: Any) -> int:
    for call in (
        pynvml.nvmlDeviceGetCurrentClocksEventReasons,
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons,
    ):
        reasons = _optional(partial(call, handle))
        if reasons is not None:
            return int(reasons)
    return 0


def live_pids(samples: Iterable[GpuSample]) -> set[int]:
    """The PIDs the samples name (to let the attribution cache forget the others)."""
    return {p.pid for s in samples for p in s.processes if p.pid is not None}
