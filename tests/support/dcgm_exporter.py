"""A stand-in for NVIDIA's DCGM exporter: DCGM-format exposition text from the same fixture
machine the fake NVML serves, on a real HTTP server on loopback.

The text follows dcgm-exporter's output: one series per GPU (labels ``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``) or MIG instance (plus ``GPU_I_PROFILE``, ``GPU_I_ID``),
repeated per pod using the device with ``namespace``, ``pod`` and ``container`` (the exporter
learns those from the kubelet's pod-resources API; here from the processes on the device and a
PID → pod table). Instance-level series are what DCGM profiles per MIG instance (graphics
engine activity, framebuffer); device-level ones stay on the GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pynvml

from tests.support.fake_nvml import FakeGpu, FakeMachine

Pod = tuple[str, str, str]  # namespace, pod, container

_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "Current clock throttle reasons.",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Total number of double-bit volatile ECC errors.",
}


def _labels(pairs: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def exposition(machine: FakeMachine, hostname: str, pods: Mapping[int, Pod]) -> str:
    """The exporter's /metrics text for ``machine`` now (XID: the last pending code, if any)."""
    lines: dict[str, list[str]] = {name: [] for name in _HELP}

    def emit(name: str, base: Mapping[str, str], users: list[Pod], value: float) -> None:
        for namespace, pod, container in users or [("", "", "")]:
            labels = {**base, "container": container, "namespace": namespace, "pod": pod}
            lines[name].append(f"{name}{_labels(labels)} {value:g}")

    for i, gpu in enumerate(machine.gpus):
        base = {
            "gpu": str(i),
            "UUID": gpu.uuid,
            "device": f"nvidia{i}",
            "modelName": gpu.name,
            "Hostname": hostname,
            "DCGM_FI_DRIVER_VERSION": "550.54.15",
        }
        u = gpu.usage
        mig_mode = gpu.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE
        users = _pods_of(gpu, None, pods)
        if not mig_mode:
            emit("DCGM_FI_DEV_GPU_UTIL", base, users, u.gpu_pct)
        emit("DCGM_FI_DEV_FB_USED", base, users, u.memory_used_mib)
        emit("DCGM_FI_DEV_FB_FREE", base, users, gpu.memory_mib - u.memory_used_mib)
        emit("DCGM_FI_DEV_POWER_USAGE", base, users, u.power_mw / 1000)
        emit("DCGM_FI_DEV_GPU_TEMP", base, users, u.temperature_c)
        emit("DCGM_FI_DEV_XID_ERRORS", base, users, u.xids[-1] if u.xids else 0)
        emit("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", base, users, u.throttle_reasons)
        emit("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", base, users, u.ecc_uncorrected or 0)
        for k, inst in enumerate(gpu.instances if mig_mode else ()):
            inst_base = {**base, "GPU_I_PROFILE": inst.profile.name, "GPU_I_ID": str(k + 1)}
            inst_users = _pods_of(gpu, k, pods)
            iu = inst.usage
            emit("DCGM_FI_PROF_GR_ENGINE_ACTIVE", inst_base, inst_users, iu.activity_pct / 100)
            emit("DCGM_FI_DEV_FB_USED", inst_base, inst_users, iu.memory_used_mib)
            emit(
                "DCGM_FI_DEV_FB_FREE",
                inst_base,
                inst_users,
                inst.profile.memory_mib - iu.memory_used_mib,
            )
    out = []
    for name, series in lines.items():
        if series:
            out += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} gauge", *series]
    return "\n".join(out) + "\n"


def _pods_of(gpu: FakeGpu, instance: int | None, pods: Mapping[int, Pod]) -> list[Pod]:
    found = {pods[p.pid] for p in gpu.usage.processes if p.instance == instance and p.pid in pods}
    return sorted(found)


@contextmanager
def serve(text: Callable[[], str]) -> Iterator[str]:
    """Serve ``text()`` at ``/metrics`` on a loopback port; yields ``host:port``; stops on exit."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
