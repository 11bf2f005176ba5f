"""GPU samples from Prometheus, on clusters that run NVIDIA's DCGM exporter.

One instant query per poll reads every DCGM series of interest with the raw points of the
last ``lookback_s`` seconds (a range selector, so each point keeps its scrape time)::

    {__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE|…"}[60s]

and the newest point of each series becomes part of a wire ``GpuSample``:

- series are grouped by ``Hostname`` (the node), ``UUID`` and ``GPU_I_ID`` (a MIG instance when
  set); the exporter repeats a device's series once per pod using it (``pod``, ``namespace``,
  ``container``, or ``exported_*`` when the scrape did not honour the exporter's labels), and
  each pod becomes a ``ProcessSample`` naming it;
- a whole GPU's utilization is ``DCGM_FI_DEV_GPU_UTIL``; a MIG instance's is
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0-1 ratio, in percent), which is also ``activity_pct``;
  a MIG-mode GPU without ``GPU_UTIL`` gets the compute-slice-weighted mean of its instances
  (slices from ``GPU_I_PROFILE``, the GPU's from its model) — what the node agent reports;
- memory total is ``FB_USED + FB_FREE`` (MiB); power W; temperature °C; throttle reasons are
  NVML's bitmask; ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` is the volatile uncorrectable count;
  PCIe and NVLink throughput come from the ``DCGM_FI_PROF_*_BYTES`` rates;
- ``DCGM_FI_DEV_XID_ERRORS`` holds the *last* XID code, not a count, so the source counts the
  changes to a non-zero code it sees across polls (the same code twice in a row counts once).

A device without a utilization series (no ``GR_ENGINE_ACTIVE`` for a MIG instance where
profiling metrics are off, or one of its instances lacking it for the GPU) is sent with
``utilization_pct`` None: not measured, its memory and health still count. A device missing the
framebuffer series is left out and logged once; Prometheus being unreachable or answering an
error raises ``PrometheusError``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from policies import mig
from policies.errors import PortalError
from portal.inventory import products
from portal.telemetry.wire import GpuSample, ProcessSample, SampleBatch, Source

log = logging.getLogger(__name__)

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
TEMPERATURE = "DCGM_FI_DEV_GPU_TEMP"
XID = "DCGM_FI_DEV_XID_ERRORS"
THROTTLE = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
ECC_DBE_VOLATILE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
PCIE_TX = "DCGM_FI_PROF_PCIE_TX_BYTES"
PCIE_RX = "DCGM_FI_PROF_PCIE_RX_BYTES"
NVLINK_TX = "DCGM_FI_PROF_NVLINK_TX_BYTES"
NVLINK_RX = "DCGM_FI_PROF_NVLINK_RX_BYTES"
METRICS = (
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    FB_USED,
    FB_FREE,
    POWER,
    TEMPERATURE,
    XID,
    THROTTLE,
    ECC_DBE_VOLATILE,
    PCIE_TX,
    PCIE_RX,
    NVLINK_TX,
    NVLINK_RX,
)
_SLICES = re.compile(r"^(\d+)g\.")


class PrometheusError(PortalError):
    """Prometheus could not be asked, or its answer was not a query result."""

    code = "prometheus"


def query(lookback_s: int, hostname: str | None = None) -> str:
    """The PromQL this source runs: every metric above, raw points of the last ``lookback_s``."""
    selectors = [f'__name__=~"{"|".join(METRICS)}"']
    if hostname is not None:
        selectors.append(f'Hostname="{hostname}"')
    return "{" + ",".join(selectors) + f"}}[{lookback_s}s]"


@dataclass
class _Device:
    node: str
    uuid: str
    gpu_instance_id: int | None
    profile: str = ""
    model: str = ""
    values: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric -> (t, v)
    pods: set[tuple[str, str]] = field(default_factory=set)

    def value(self, metric: str) -> float | None:
        got = self.values.get(metric)
        return None if got is None else got[1]

    @property
    def at(self) -> float:
        return max(t for t, _ in self.values.values())


class PrometheusSource:
    """Reads DCGM exporter series from Prometheus as wire ``SampleBatch``es, one per node.

    ``client`` is an ``httpx.Client`` with the Prometheus base URL (the source does not close
    it); ``hostname`` limits the query to one node's series.
    """

    def __init__(
        self, client: httpx.Client, *, lookback_s: int = 60, hostname: str | None = None
    ) -> None:
        if lookback_s < 1:
            raise ValueError(f"lookback_s must be >= 1, got {lookback_s}")
        self._client = client
        self._query = query(lookback_s, hostname)
        self._xid: dict[str, tuple[float, int]] = {}  # GPU UUID -> (last code, count)
        self._warned: set[str] = set()

    def batches(self) -> list[SampleBatch]:
        """One batch per node with the newest sample of each of its devices."""
        devices = _group(self._series())
        by_node: dict[str, list[GpuSample]] = {}
        for key in sorted(devices, key=_order):
            sample = self._sample(devices[key], devices)
            if sample is not None:
                by_node.setdefault(key[0], []).append(sample)
        return [
            SampleBatch(node=node, source=Source.DCGM, samples=samples)
            for node, samples in sorted(by_node.items())
        ]

    def _series(self) -> list[Mapping[str, Any]]:
        try:
            response = self._client.get("/api/v1/query", params={"query": self._query})
        except httpx.HTTPError as e:
            raise PrometheusError(f"Prometheus unreachable: {type(e).__name__}: {e}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") != "success":
            detail = body.get("error") if isinstance(body, dict) else response.text[:200]
            raise PrometheusError(
                f"Prometheus answered {response.status_code} to {self._query!r}: {detail}"
            )
        data = body.get("data") or {}
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"expected a matrix result, got {data.get('resultType')!r}")
        result = data.get("result")
        return result if isinstance(result, list) else []

    def _sample(
        self, d: _Device, devices: Mapping[tuple[str, str, int | None], _Device]
    ) -> GpuSample | None:
        fb_used, fb_free = d.value(FB_USED), d.value(FB_FREE)
        if d.gpu_instance_id is not None:
            active = d.value(GR_ENGINE_ACTIVE)
            utilization = _percent(active)
        else:
            utilization = d.value(GPU_UTIL)
            if utilization is None:
                utilization = _from_instances(d, devices.values())
        if fb_used is None or fb_free is None or fb_used + fb_free <= 0:
            self._warn_once(d, "no framebuffer series")
            return None
        active = d.value(GR_ENGINE_ACTIVE)
        try:
            return GpuSample(
                gpu_uuid=d.uuid,
                gpu_instance_id=d.gpu_instance_id,
                at=d.at,
                utilization_pct=utilization,
                activity_pct=_percent(active),
                memory_used_mib=fb_used,
                memory_total_mib=fb_used + fb_free,
                power_w=d.value(POWER),
                temperature_c=d.value(TEMPERATURE),
                throttle_reasons=int(d.value(THROTTLE) or 0),
                ecc_uncorrectable=int(d.value(ECC_DBE_VOLATILE) or 0),
                pcie_tx_bytes_s=d.value(PCIE_TX),
                pcie_rx_bytes_s=d.value(PCIE_RX),
                nvlink_tx_bytes_s=d.value(NVLINK_TX),
                nvlink_rx_bytes_s=d.value(NVLINK_RX),
                **self._xids(d),
                processes=[ProcessSample(namespace=ns, pod=pod) for ns, pod in sorted(d.pods)],
            )
        except ValidationError as e:
            self._warn_once(d, f"values out of range: {e.errors()[0]['msg']}")
            return None

    def _xids(self, d: _Device) -> dict[str, Any]:
        code = d.value(XID)
        if d.gpu_instance_id is not None or code is None:
            return {}
        last, count = self._xid.get(d.uuid, (0.0, 0))
        if code > 0 and code != last:
            count += 1
        self._xid[d.uuid] = (code, count)
        return {"xid_count": count, "last_xid": int(code) if code > 0 else None}

    def _warn_once(self, d: _Device, why: str) -> None:
        key = f"{d.node}/{d.uuid}/{d.gpu_instance_id}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning("skipping %s on %s: %s", key, d.node, why)


def _label(labels: Mapping[str, str], name: str) -> str:
    # Without honor_labels Prometheus renames the exporter's pod labels to exported_*.
    return labels.get(f"exported_{name}") or labels.get(name) or ""


def _group(series: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int | None], _Device]:
    devices: dict[tuple[str, str, int | None], _Device] = {}
    for s in series:
        labels = s.get("metric") or {}
        values = s.get("values") or []
        name, node, uuid = labels.get("__name__"), labels.get("Hostname"), labels.get("UUID")
        if not (name and node and uuid and values):
            continue
        gi_text = labels.get("GPU_I_ID", "")
        gi = int(gi_text) if gi_text.isdigit() else None
        key = (node, uuid, gi)
        d = devices.setdefault(key, _Device(node=node, uuid=uuid, gpu_instance_id=gi))
        d.profile = d.profile or labels.get("GPU_I_PROFILE", "")
        d.model = d.model or labels.get("modelName", "")
        t, text = values[-1]
        v = float(text)
        if math.isfinite(v) and (name not in d.values or t >= d.values[name][0]):
            d.values[name] = (float(t), v)
        namespace, pod = _label(labels, "namespace"), _label(labels, "pod")
        if namespace and pod:
            d.pods.add((namespace, pod))
    return devices


def _from_instances(gpu: _Device, devices: Iterable[_Device]) -> float | None:
    """A MIG-mode GPU's utilization: its instances' activity weighted by compute slices."""
    instances = [
        d
        for d in devices
        if d.uuid == gpu.uuid and d.node == gpu.node and d.gpu_instance_id is not None
    ]
    if not instances:
        return None
    try:
        total = mig.geometry(products.model_name(gpu.model)).compute_slices
    except PortalError:
        return None
    weighted = 0.0
    for inst in instances:
        m = _SLICES.match(inst.profile)
        active = inst.value(GR_ENGINE_ACTIVE)
        if m is None or active is None:
            return None
        weighted += (_percent(active) or 0.0) * int(m.group(1))
    return min(weighted / total, 100.0)


def _percent(ratio: float | None) -> float | None:
    """DCGM's 0-1 ratio in percent, without the binary noise of the product (0.55 → 55.0)."""
    return None if ratio is None else min(round(ratio * 100, 6), 100.0)


def _order(key: tuple[str, str, int | None]) -> tuple[str, str, int]:
    return key[0], key[1], -1 if key[2] is None else key[2]
