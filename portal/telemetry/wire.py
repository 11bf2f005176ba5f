"""The ingest wire format: what a node agent or the Prometheus source POSTs to
``/api/v1/telemetry/samples``.

One ``SampleBatch`` carries samples of one node from one source. Each ``GpuSample`` names a
physical GPU by its UUID and, for a MIG instance, the instance's ``gpu_instance_id`` (NVML's GPU
instance id, DCGM's ``GPU_I_ID`` label); its ``processes`` attribute the device to workloads.

Two kinds of bad input, two answers:

- a malformed batch (a wrong type, a missing field, NaN or infinity, a negative value, a
  percentage above 100, too many samples) is refused whole with the API's error body and
  changes nothing: the sender has a bug to fix;
- a well-formed sample the portal cannot use (an unknown GPU, a time far in the future or past
  the raw retention) is rejected alone, with its index and reason in ``IngestResult``; the
  rest of the batch is stored. A sample already stored (same device and time) is a duplicate:
  counted, never stored twice.

Times are epoch seconds (UTC), fractions allowed.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_SAMPLES_PER_BATCH = 4096
MAX_PROCESSES_PER_SAMPLE = 256
MAX_REJECTIONS_LISTED = 100

_NODE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# NVML prints "GPU-<uuid>" and "MIG-<uuid>"; simulated inventories use any printable id.
_UUID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


MAX_EPOCH_S = 1e10
"""Upper bound of a sample's time: far beyond any real clock, and its milliseconds stay exact
integers (an unbounded float overflowed converting to milliseconds)."""


class Source(StrEnum):
    """Where the samples were read."""

    NVML = "nvml"  # the node agent, through NVIDIA's management library
    DCGM = "dcgm"  # the Prometheus source, from NVIDIA's DCGM exporter metrics


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ProcessSample(WireModel):
    """A process (or a pod's containers) using the device, and the workload it belongs to.

    Attribution, most specific first: ``workload_id`` (the agent read it from the pod label or
    the server's environment); else ``user`` + ``server`` (a local notebook server: the
    workload of that owner with that name); else ``namespace`` + ``pod`` (recorded for the
    dashboards; the portal maps it when the pod carries the workload id). At least one must
    be given.
    """

    pid: int | None = Field(default=None, ge=0, description="Host process id; null: unknown.")
    workload_id: str | None = Field(
        default=None, min_length=1, max_length=64, description="The portal workload id."
    )
    namespace: str | None = Field(default=None, min_length=1, max_length=253)
    pod: str | None = Field(default=None, min_length=1, max_length=253)
    user: str | None = Field(default=None, min_length=1, max_length=253)
    server: str | None = Field(
        default=None, max_length=253, description='Named server; "" is the default server.'
    )
    memory_used_mib: float = Field(default=0.0, ge=0, description="GPU memory it holds, MiB.")
    sm_util_pct: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Its share of the GPU's SM time, % of the whole GPU; null: not measured.",
    )

    @model_validator(mode="after")
    def _attributed(self) -> ProcessSample:
        if self.workload_id is None and self.user is None and self.pod is None:
            raise ValueError(
                "a process needs an attribution: workload_id, user (+ server) or namespace + pod"
            )
        if (self.pod is None) != (self.namespace is None):
            raise ValueError("pod and namespace go together")
        return self


class GpuSample(WireModel):
    """One GPU or MIG instance at one time. Counters are cumulative since the driver loaded."""

    gpu_uuid: str = Field(
        min_length=1, max_length=96, pattern=_UUID, description="The physical GPU's UUID."
    )
    gpu_instance_id: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="MIG GPU instance id (DCGM GPU_I_ID); null: the sample is of the whole GPU.",
    )
    mig_uuid: str | None = Field(
        default=None, min_length=1, max_length=96, pattern=_UUID, description="MIG-<uuid>."
    )
    at: float = Field(
        gt=0,
        lt=MAX_EPOCH_S,
        description="When it was measured, epoch seconds (UTC), before the year 2286.",
    )
    # Optional with a default, like every other measurement here: an agent that always sends
    # a number (every agent before this was optional) stays valid unchanged, and a device NVML
    # cannot measure (a MIG instance without GPM) is sent with null rather than a made-up 0.
    utilization_pct: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Percent of time a kernel ran (NVML/DCGM GPU_UTIL; a MIG instance: its "
        "engine activity); null or absent: not measured, which is not 0 %.",
    )
    activity_pct: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="SM / graphics engine activity (DCGM GR_ENGINE_ACTIVE); null: unknown.",
    )
    memory_used_mib: float = Field(ge=0, description="Framebuffer memory in use, MiB.")
    memory_total_mib: float = Field(gt=0, description="Framebuffer memory of the device, MiB.")
    power_w: float | None = Field(default=None, ge=0, description="Power draw, W.")
    temperature_c: float | None = Field(default=None, ge=-50, le=200, description="Degrees C.")
    throttle_reasons: int = Field(
        default=0, ge=0, lt=2**63, description="NVML clocks-throttle-reason bitmask."
    )
    xid_count: int = Field(default=0, ge=0, lt=2**63, description="XID errors seen, cumulative.")
    last_xid: int | None = Field(default=None, ge=0, description="The last XID error code.")
    ecc_uncorrectable: int = Field(default=0, ge=0, lt=2**63, description="Cumulative.")
    ecc_correctable: int = Field(default=0, ge=0, lt=2**63, description="Cumulative.")
    pcie_tx_bytes_s: float | None = Field(default=None, ge=0)
    pcie_rx_bytes_s: float | None = Field(default=None, ge=0)
    nvlink_tx_bytes_s: float | None = Field(default=None, ge=0)
    nvlink_rx_bytes_s: float | None = Field(default=None, ge=0)
    processes: list[ProcessSample] = Field(
        default_factory=list, max_length=MAX_PROCESSES_PER_SAMPLE
    )

    @model_validator(mode="after")
    def _consistent(self) -> GpuSample:
        if self.mig_uuid is not None and self.gpu_instance_id is None:
            raise ValueError("a MIG sample (mig_uuid) needs its gpu_instance_id")
        if self.memory_used_mib > self.memory_total_mib:
            raise ValueError(
                f"memory_used_mib {self.memory_used_mib} exceeds memory_total_mib "
                f"{self.memory_total_mib}"
            )
        return self

    @property
    def device(self) -> str:
        """The device's id in the portal: the GPU UUID, or ``<gpu uuid>/gi<id>`` for MIG."""
        return device_id(self.gpu_uuid, self.gpu_instance_id)


def device_id(gpu_uuid: str, gpu_instance_id: int | None) -> str:
    """One id per device, the same whichever source measured it."""
    return gpu_uuid if gpu_instance_id is None else f"{gpu_uuid}/gi{gpu_instance_id}"


class SampleBatch(WireModel):
    """Samples of one node from one source."""

    node: str = Field(min_length=1, max_length=253, pattern=_NODE, description="Node name.")
    source: Source
    samples: list[GpuSample] = Field(max_length=MAX_SAMPLES_PER_BATCH)


class Rejection(WireModel):
    index: int = Field(ge=0, description="The sample's index in the batch.")
    device: str = Field(description="The device the sample named.")
    reason: str = Field(description="Why it was not stored, and what would be accepted.")


class IngestResult(WireModel):
    """What happened to each sample of a batch: ``accepted + duplicates + rejected`` = sent."""

    accepted: int = Field(ge=0, description="Stored now.")
    duplicates: int = Field(ge=0, description="Already stored (same device and time).")
    rejected: int = Field(ge=0, description="Not stored; see rejections.")
    rejections: list[Rejection] = Field(
        description=f"The first {MAX_REJECTIONS_LISTED} rejections, in batch order."
    )
