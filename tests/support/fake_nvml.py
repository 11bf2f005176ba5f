# ruff: noqa: N802  (methods carry the C function names pynvml looks up)
# mypy: disable-error-code="no-any-return"
# (the methods return pynvml's return codes, constants of an untyped module)
"""A fake of the NVML C library, for testing NVML discovery without a GPU.

Only the library is faked: ``install()`` makes pynvml's ``CDLL("libnvidia-ml.so.1")`` return a
``FakeNvmlLibrary`` (or fail like a host without the driver), so pynvml's real Python wrappers
run unchanged and call the methods below exactly as they would call the C functions: with
ctypes arguments (handles as pointers, ``byref(...)`` out-parameters whose target is
``ref._obj``, string buffers), returning NVML return codes. A function the fake does not
define fails with ``NVML_ERROR_FUNCTION_NOT_FOUND``, as with an old driver.

Handles are fake addresses, never dereferenced: GPU ``i`` is ``0x10000 + i * 0x100``, its MIG
device ``k`` is that plus ``0x10 + k``, its GPU instance ``j`` is ``0x20000 + i * 0x100 + j``,
the event set is ``0x30000`` and GPM sample ``n`` is ``0x40000 + n``.

Sampling calls (utilization, power, temperature, throttle reasons, ECC, PCIe and NVLink
throughput, XID events, running processes and their utilization, GPM per MIG instance) read
``FakeGpu.usage`` and ``FakeInstance.usage``; tests change those between samples.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pynvml
import pytest

MIB = 1024 * 1024


class Driver(Enum):
    LOADED = "loaded"
    MISSING = "missing"  # libnvidia-ml.so.1 cannot be opened
    NOT_LOADED = "not-loaded"  # the library is there, the kernel module is not


@dataclass(frozen=True)
class FakeProfile:
    """A GPU instance profile: NVML's enum index, its id, name and size."""

    index: int
    id: int
    name: str
    slices: int
    memory_mib: int
    instance_count: int


@dataclass(frozen=True)
class FakeProcess:
    """A compute process: on the GPU, or on MIG instance ``instance`` (index in ``instances``)."""

    pid: int
    memory_mib: int
    sm_pct: int | None = None  # None: no per-process utilization sample for it
    instance: int | None = None


@dataclass
class FakeUsage:
    """What the sampling calls report for a GPU (or, where it applies, a MIG instance)."""

    gpu_pct: int = 0
    memory_pct: int = 0
    memory_used_mib: int = 0
    power_mw: int = 0
    temperature_c: int = 0
    throttle_reasons: int = 0
    ecc_uncorrected: int | None = 0  # None: ECC not supported
    pcie_tx_kib_s: int = 0
    pcie_rx_kib_s: int = 0
    nvlink_tx_kib: int = 0  # cumulative counters
    nvlink_rx_kib: int = 0
    activity_pct: float = 0.0  # GPM graphics activity (MIG instances on GPM-capable GPUs)
    gpm_fails: bool = False  # the GPM metric of this MIG instance answers "not supported"
    processes: tuple[FakeProcess, ...] = ()
    xids: list[int] = field(default_factory=list)  # pending XID events, consumed by waits


@dataclass(frozen=True)
class FakeInstance:
    profile: FakeProfile
    start: int
    uuid: str
    usage: FakeUsage = field(default_factory=FakeUsage, compare=False)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    memory_mib: int
    bus_id: str
    numa: int | None = 0  # None: nvmlDeviceGetNumaNodeId is not supported
    cpus: frozenset[int] = frozenset()
    mig_mode: int | None = None  # None: MIG not supported; else NVML_DEVICE_MIG_ENABLE/DISABLE
    profiles: tuple[FakeProfile, ...] = ()
    instances: tuple[FakeInstance, ...] = ()
    nvlinks: tuple[tuple[str, int], ...] = ()  # (remote bus id, remote device type) per link
    gpm: bool = False  # GPU Performance Monitoring (Hopper and later)
    lost: bool = False  # fell off the bus: memory and utilization queries fail
    usage: FakeUsage = field(default_factory=FakeUsage)


@dataclass
class FakeMachine:
    gpus: list[FakeGpu]
    # NVML_TOPOLOGY_* level for a pair of GPU indices
    ancestor: Callable[[int, int], int] = lambda i, j: pynvml.NVML_TOPOLOGY_SYSTEM
    driver: Driver = Driver.LOADED
    calls: list[str] = field(default_factory=list)


def _addr(handle: Any) -> int:
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value or 0)


def _set_handle(ref: Any, addr: int) -> None:
    ctypes.c_void_p.from_buffer(ref._obj).value = addr


_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


def _int(arg: Any) -> int:
    return int(arg.value) if hasattr(arg, "value") else int(arg)


class FakeNvmlLibrary:
    """Stands in for the loaded ``libnvidia-ml.so.1``; one method per C function."""

    def __init__(self, machine: FakeMachine) -> None:
        self.machine = machine
        self.initialized = False
        self.event_gpus: set[int] = set()
        self.gpm_samples: dict[int, tuple[int, int | None]] = {}

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            object.__getattribute__(self, "machine").calls.append(name)
        return object.__getattribute__(self, name)

    # -- helpers -----------------------------------------------------------------------------
    def _gpu(self, handle: Any) -> tuple[int, FakeGpu] | None:
        addr = _addr(handle)
        i, rest = divmod(addr - 0x10000, 0x100)
        if rest != 0 or not 0 <= i < len(self.machine.gpus):
            return None
        return i, self.machine.gpus[i]

    def _mig_device(self, handle: Any) -> tuple[FakeGpu, FakeInstance] | None:
        addr = _addr(handle)
        i, rest = divmod(addr - 0x10000, 0x100)
        if not 0 <= i < len(self.machine.gpus) or rest < 0x10:
            return None
        gpu = self.machine.gpus[i]
        k = rest - 0x10
        return (gpu, gpu.instances[k]) if k < len(gpu.instances) else None

    # -- library ------------------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> int:
        if self.machine.driver is Driver.NOT_LOADED:
            return pynvml.NVML_ERROR_DRIVER_NOT_LOADED
        self.initialized = True
        return pynvml.NVML_SUCCESS

    def nvmlShutdown(self) -> int:
        self.initialized = False
        return pynvml.NVML_SUCCESS

    def nvmlErrorString(self, code: int) -> bytes:
        return f"NVML error {code}".encode()

    def nvmlDeviceGetCount_v2(self, count_ref: Any) -> int:
        if not self.initialized:
            return pynvml.NVML_ERROR_UNINITIALIZED
        count_ref._obj.value = len(self.machine.gpus)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device_ref: Any) -> int:
        i = _int(index)
        if not 0 <= i < len(self.machine.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _set_handle(device_ref, 0x10000 + i * 0x100)
        return pynvml.NVML_SUCCESS

    # -- device facts --------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        buf.value = found[1].name.encode()
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        found = self._gpu(handle)
        if found is not None:
            buf.value = found[1].uuid.encode()
            return pynvml.NVML_SUCCESS
        mig = self._mig_device(handle)
        if mig is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        buf.value = mig[1].uuid.encode()
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory_ref: Any) -> int:
        found = self._gpu(handle)
        if found is not None and found[1].lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if found is not None:
            total, used = found[1].memory_mib, found[1].usage.memory_used_mib
        elif (mig := self._mig_device(handle)) is not None:
            total, used = mig[1].profile.memory_mib, mig[1].usage.memory_used_mib
        else:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        memory_ref._obj.total = total * MIB
        memory_ref._obj.free = (total - used) * MIB
        memory_ref._obj.used = used * MIB
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, pci_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        pci_ref._obj.busId = found[1].bus_id.encode()
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetNumaNodeId(self, handle: Any, node_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if found[1].numa is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        node_ref._obj.value = found[1].numa
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetCpuAffinity(self, handle: Any, words: int, array_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        array = array_ref._obj
        for w in range(_int(words)):
            array[w] = sum(1 << (c - w * 64) for c in found[1].cpus if w * 64 <= c < w * 64 + 64)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any, level_ref: Any) -> int:
        first, second = self._gpu(a), self._gpu(b)
        if first is None or second is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        level_ref._obj.value = self.machine.ancestor(first[0], second[0])
        return pynvml.NVML_SUCCESS

    # -- NVLink --------------------------------------------------------------------------------
    def _link(self, handle: Any, link: Any) -> tuple[str, int] | int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if not found[1].nvlinks:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        n = _int(link)
        if n >= len(found[1].nvlinks):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return found[1].nvlinks[n]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active_ref: Any) -> int:
        got = self._link(handle, link)
        if isinstance(got, int):
            return got
        active_ref._obj.value = pynvml.NVML_FEATURE_ENABLED
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, pci_ref: Any) -> int:
        got = self._link(handle, link)
        if isinstance(got, int):
            return got
        pci_ref._obj.busId = got[0].encode()
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, type_ref: Any) -> int:
        got = self._link(handle, link)
        if isinstance(got, int):
            return got
        type_ref._obj.value = got[1]
        return pynvml.NVML_SUCCESS

    # -- MIG -----------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Any, current_ref: Any, pending_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if found[1].mig_mode is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        current_ref._obj.value = found[1].mig_mode
        pending_ref._obj.value = found[1].mig_mode
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, profile: Any, info_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        info = info_ref._obj
        if info.version != pynvml.nvmlGpuInstanceProfileInfo_v2:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        match = [p for p in found[1].profiles if p.index == _int(profile)]
        if not match:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        p = match[0]
        info.id = p.id
        info.sliceCount = p.slices
        info.instanceCount = p.instance_count
        info.memorySizeMB = p.memory_mib
        info.name = f"MIG {p.name}".encode()
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: Any, array: Any, count_ref: Any
    ) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        i, gpu = found
        if gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        chosen = [j for j, inst in enumerate(gpu.instances) if inst.profile.id == _int(profile_id)]
        if len(chosen) > len(array):
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for slot, j in enumerate(chosen):
            array[slot] = ctypes.cast(
                ctypes.c_void_p(0x20000 + i * 0x100 + j), pynvml.c_nvmlGpuInstance_t
            )
        count_ref._obj.value = len(chosen)
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any, info_ref: Any) -> int:
        i, j = divmod(_addr(gpu_instance) - 0x20000, 0x100)
        if not 0 <= i < len(self.machine.gpus) or j >= len(self.machine.gpus[i].instances):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        inst = self.machine.gpus[i].instances[j]
        info = info_ref._obj
        info.device = ctypes.cast(ctypes.c_void_p(0x10000 + i * 0x100), pynvml.c_nvmlDevice_t)
        info.id = j + 1  # GPU instance ids are small integers, unique per GPU
        info.profileId = inst.profile.id
        info.placement.start = inst.start
        info.placement.size = inst.profile.slices
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        count_ref._obj.value = 7 if found[1].mig_mode is not None else 0
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, device_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        i, gpu = found
        k = _int(index)
        if k >= len(gpu.instances):
            return pynvml.NVML_ERROR_NOT_FOUND
        _set_handle(device_ref, 0x10000 + i * 0x100 + 0x10 + k)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, id_ref: Any) -> int:
        found = self._mig_device(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        gpu, inst = found
        id_ref._obj.value = gpu.instances.index(inst) + 1
        return pynvml.NVML_SUCCESS

    # -- sampling ------------------------------------------------------------------------------
    def _usage(self, handle: Any) -> FakeUsage | None:
        found = self._gpu(handle)
        return None if found is None else found[1].usage

    def nvmlDeviceGetUtilizationRates(self, handle: Any, util_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            # MIG devices have no utilization counters; NVML says so.
            mig = self._mig_device(handle)
            return pynvml.NVML_ERROR_INVALID_ARGUMENT if mig is None else _NOT_SUPPORTED
        if found[1].mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE:
            return _NOT_SUPPORTED
        util_ref._obj.gpu = found[1].usage.gpu_pct
        util_ref._obj.memory = found[1].usage.memory_pct
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: Any, power_ref: Any) -> int:
        usage = self._usage(handle)
        if usage is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        power_ref._obj.value = usage.power_mw
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp_ref: Any) -> int:
        usage = self._usage(handle)
        if usage is None or _int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        temp_ref._obj.value = usage.temperature_c
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons_ref: Any) -> int:
        usage = self._usage(handle)
        if usage is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        reasons_ref._obj.value = usage.throttle_reasons
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: Any, counter_type: Any, count_ref: Any
    ) -> int:
        usage = self._usage(handle)
        if usage is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if usage.ecc_uncorrected is None:
            return _NOT_SUPPORTED
        uncorrected = _int(error_type) == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        count_ref._obj.value = usage.ecc_uncorrected if uncorrected else 0
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, value_ref: Any) -> int:
        usage = self._usage(handle)
        if usage is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        tx = _int(counter) == pynvml.NVML_PCIE_UTIL_TX_BYTES
        value_ref._obj.value = usage.pcie_tx_kib_s if tx else usage.pcie_rx_kib_s
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        gpu = found[1]
        counters = {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: gpu.usage.nvlink_tx_kib,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: gpu.usage.nvlink_rx_kib,
        }
        values = values_ref._obj
        for k in range(_int(count)):
            entry = values[k]
            if entry.fieldId not in counters or not gpu.nvlinks:
                entry.nvmlReturn = _NOT_SUPPORTED
                continue
            entry.nvmlReturn = pynvml.NVML_SUCCESS
            entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.value.ullVal = counters[entry.fieldId]
        return pynvml.NVML_SUCCESS

    def _processes(self, handle: Any) -> tuple[FakeProcess, ...] | None:
        found = self._gpu(handle)
        if found is not None:
            return found[1].usage.processes
        mig = self._mig_device(handle)
        if mig is None:
            return None
        gpu, inst = mig
        k = gpu.instances.index(inst)
        return tuple(p for p in gpu.usage.processes if p.instance == k)

    def nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: Any, count_ref: Any, array: Any
    ) -> int:
        procs = self._processes(handle)
        if procs is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        count = count_ref._obj
        if array is None or count.value < len(procs):
            count.value = len(procs)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if procs else pynvml.NVML_SUCCESS
        for slot, p in enumerate(procs):
            array[slot].pid = p.pid
            array[slot].usedGpuMemory = p.memory_mib * MIB
            array[slot].gpuInstanceId = 0xFFFFFFFF if p.instance is None else p.instance + 1
            array[slot].computeInstanceId = 0xFFFFFFFF if p.instance is None else 0
        count.value = len(procs)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetProcessUtilization(
        self, handle: Any, array: Any, count_ref: Any, since: Any
    ) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if found[1].mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE:
            return _NOT_SUPPORTED
        sampled = [p for p in found[1].usage.processes if p.sm_pct is not None]
        if not sampled:
            return pynvml.NVML_ERROR_NOT_FOUND
        count = count_ref._obj
        if array is None or count.value < len(sampled):
            count.value = len(sampled)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for slot, p in enumerate(sampled):
            array[slot].pid = p.pid
            array[slot].timeStamp = _int(since) + 1
            array[slot].smUtil = p.sm_pct or 0
        count.value = len(sampled)
        return pynvml.NVML_SUCCESS

    # -- XID events ----------------------------------------------------------------------------
    def nvmlEventSetCreate(self, set_ref: Any) -> int:
        _set_handle(set_ref, 0x30000)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        found = self._gpu(handle)
        if found is None or _addr(event_set) != 0x30000:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if _int(types) & ~pynvml.nvmlEventTypeXidCriticalError:
            return _NOT_SUPPORTED
        self.event_gpus.add(found[0])
        return pynvml.NVML_SUCCESS

    def nvmlEventSetWait_v2(self, event_set: Any, data_ref: Any, timeout_ms: Any) -> int:
        for i in sorted(self.event_gpus):
            xids = self.machine.gpus[i].usage.xids
            if xids:
                data = data_ref._obj
                data.device = ctypes.cast(
                    ctypes.c_void_p(0x10000 + i * 0x100), pynvml.c_nvmlDevice_t
                )
                data.eventType = pynvml.nvmlEventTypeXidCriticalError
                data.eventData = xids.pop(0)
                return pynvml.NVML_SUCCESS
        return pynvml.NVML_ERROR_TIMEOUT

    def nvmlEventSetFree(self, event_set: Any) -> int:
        self.event_gpus.clear()
        return pynvml.NVML_SUCCESS

    # -- GPM (per MIG instance activity) -------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any, support_ref: Any) -> int:
        found = self._gpu(handle)
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        support_ref._obj.isSupportedDevice = int(found[1].gpm)
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleAlloc(self, sample_ref: Any) -> int:
        addr = 0x40000 + len(self.gpm_samples)
        self.gpm_samples[addr] = (-1, None)
        _set_handle(sample_ref, addr)
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        self.gpm_samples.pop(_addr(sample), None)
        return pynvml.NVML_SUCCESS

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: Any, sample: Any) -> int:
        found = self._gpu(handle)
        if found is None or _addr(sample) not in self.gpm_samples:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if not found[1].gpm:
            return _NOT_SUPPORTED
        gi = _int(gpu_instance_id)
        if not 1 <= gi <= len(found[1].instances):
            return pynvml.NVML_ERROR_NOT_FOUND
        self.gpm_samples[_addr(sample)] = (found[0], gi)
        return pynvml.NVML_SUCCESS

    def nvmlGpmMetricsGet(self, metrics_ref: Any) -> int:
        request = metrics_ref._obj
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first = self.gpm_samples.get(_addr(request.sample1))
        second = self.gpm_samples.get(_addr(request.sample2))
        if first is None or second is None or first != second or second[1] is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        inst = self.machine.gpus[second[0]].instances[second[1] - 1]
        for k in range(request.numMetrics):
            metric = request.metrics[k]
            if metric.metricId == pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL and inst.usage.gpm_fails:
                metric.nvmlReturn = _NOT_SUPPORTED
            elif metric.metricId == pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = inst.usage.activity_pct
            else:
                metric.nvmlReturn = _NOT_SUPPORTED
        return pynvml.NVML_SUCCESS


def install(monkeypatch: pytest.MonkeyPatch, machine: FakeMachine) -> FakeNvmlLibrary:
    """Make pynvml load the fake library for ``machine`` (undone when the test ends)."""
    lib = FakeNvmlLibrary(machine)

    def cdll(name: str, *args: Any, **kwargs: Any) -> FakeNvmlLibrary:
        if machine.driver is Driver.MISSING:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return lib

    monkeypatch.setattr(pynvml, "CDLL", cdll)
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    return lib


# -- machines -------------------------------------------------------------------------------

A100_80GB_PROFILES = (
    FakeProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 9728, 7),
    FakeProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 9728, 1),
    FakeProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 19968, 4),
    FakeProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 19968, 3),
    FakeProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 40192, 2),
    FakeProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 40192, 1),
    FakeProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 80896, 1),
)


def _profile(name: str) -> FakeProfile:
    return next(p for p in A100_80GB_PROFILES if p.name == name)


def _by_numa(numa: list[int]) -> Callable[[int, int], int]:
    def ancestor(i: int, j: int) -> int:
        if numa[i] == numa[j]:
            return pynvml.NVML_TOPOLOGY_NODE
        return pynvml.NVML_TOPOLOGY_SYSTEM

    return ancestor


HGX_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


def hgx_h100() -> FakeMachine:
    """8x H100 80GB HBM3 on an HGX board: 18 NVLinks per GPU, all to NVSwitches."""
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    switches = [f"00000000:{0xC1 + s:02X}:00.0" for s in range(4)]
    gpus = [
        FakeGpu(
            name="NVIDIA H100 80GB HBM3",
            uuid=f"GPU-h100-{i}",
            memory_mib=81559,
            bus_id=f"00000000:{bus}:00.0",
            numa=numa[i],
            mig_mode=pynvml.NVML_DEVICE_MIG_DISABLE,
            nvlinks=tuple(
                (switches[link % 4], pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH) for link in range(18)
            ),
        )
        for i, bus in enumerate(HGX_BUSES)
    ]
    return FakeMachine(gpus=gpus, ancestor=_by_numa(numa))


def a100_mig() -> FakeMachine:
    """4x A100 80GB PCIe, NVLink bridges 0-1 and 2-3 (12 links); GPU 0 and 1 in MIG mode.

    GPU 0 holds 2g.20gb@0, 1g.10gb@2, 1g.10gb@3 and 3g.40gb@4; GPU 1 is in MIG mode with no
    instances yet.
    """
    numa = [0, 0, 1, 1]
    buses = [f"00000000:{b}:00.0" for b in ("17", "31", "B1", "CA")]
    instances = (
        FakeInstance(_profile("3g.40gb"), 4, "MIG-a100-0-3g"),
        FakeInstance(_profile("2g.20gb"), 0, "MIG-a100-0-2g"),
        FakeInstance(_profile("1g.10gb"), 2, "MIG-a100-0-1g-a"),
        FakeInstance(_profile("1g.10gb"), 3, "MIG-a100-0-1g-b"),
    )
    gpus = []
    for i in range(4):
        peer = buses[i ^ 1]
        gpus.append(
            FakeGpu(
                name="NVIDIA A100 80GB PCIe",
                uuid=f"GPU-a100-{i}",
                memory_mib=81920,
                bus_id=buses[i],
                numa=numa[i],
                mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE if i < 2 else pynvml.NVML_DEVICE_MIG_DISABLE,
                profiles=A100_80GB_PROFILES,
                instances=instances if i == 0 else (),
                nvlinks=tuple((peer, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU) for _ in range(12)),
            )
        )
    return FakeMachine(gpus=gpus, ancestor=_by_numa(numa))


def t4_two_sockets() -> FakeMachine:
    """2x Tesla T4 on two sockets; an old driver without NUMA ids, MIG or NVLink."""
    return FakeMachine(
        gpus=[
            FakeGpu(
                name="Tesla T4",
                uuid=f"GPU-t4-{i}",
                memory_mib=15360,
                bus_id=f"00000000:{bus}:00.0",
                numa=None,
                cpus=frozenset(range(i * 16, i * 16 + 16)),
            )
            for i, bus in enumerate(("3B", "AF"))
        ],
        ancestor=lambda i, j: pynvml.NVML_TOPOLOGY_SYSTEM,
    )


def no_driver(driver: Driver = Driver.MISSING) -> FakeMachine:
    return FakeMachine(gpus=[], driver=driver)


def h100_mig() -> FakeMachine:
    """2x H100 80GB HBM3 with GPU Performance Monitoring; GPU 0 in MIG mode with 3g.40gb@0
    (GPU instance 1) and 3g.40gb@4 (GPU instance 2), GPU 1 whole."""
    instances = (
        FakeInstance(_profile("3g.40gb"), 0, "MIG-h100-0-a"),
        FakeInstance(_profile("3g.40gb"), 4, "MIG-h100-0-b"),
    )
    return FakeMachine(
        gpus=[
            FakeGpu(
                name="NVIDIA H100 80GB HBM3",
                uuid=f"GPU-h100m-{i}",
                memory_mib=81559,
                bus_id=f"00000000:{bus}:00.0",
                mig_mode=(pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE)[i == 0],
                profiles=A100_80GB_PROFILES,  # same names and slices as the H100's
                instances=instances if i == 0 else (),
                gpm=True,
            )
            for i, bus in enumerate(("1B", "43"))
        ],
        ancestor=lambda i, j: pynvml.NVML_TOPOLOGY_NODE,
    )
