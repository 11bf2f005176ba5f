"""What an inference service is: a frozen value checked on construction, stored as JSON.

A service runs replicas of an engine (a preset, or a custom command), each with ``devices``
(whole GPUs, a MIG instance or a share), serving one model (a URI and its digest). Every
check raises ``InvalidRequest`` naming the field as the API's body spells it
(``engine.preset``, ``replicas.max``, ``model.digest``, ``devices``...), so a bad service is a
422 that names what to fix and nothing is created.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from policies.errors import InvalidRequest
from policies.requests import MAX_PRIORITY, DeviceRequest
from policies.services import ModelRef, Replicas, ScalingMetric, ScalingRule, WarmPolicy
from portal.inference.weights import check_fetchable
from portal.jobs.spec import RESERVED_ENV, device_request
from portal.jobs.spec import Backend as Backend
from portal.store.records import QuotaRecord

MAX_ARGS = 256
PLACEHOLDERS = ("{model}", "{name}", "{port}", "{host}")
"""What a preset's or a custom command's arguments may contain; the backend fills them in:
the model's folder (or URI), the served model name, the replica's port and address."""

SERVICE_RESERVED_ENV = RESERVED_ENV | {"GPUPORTAL_SERVICE_ID", "GPUPORTAL_REPLICA", "PORT"}


class Preset(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    TEST = "test"  # the project's test engine (portal.inference.testengine)
    CUSTOM = "custom"  # ``engine.command`` as given


@dataclass(frozen=True, slots=True)
class EnginePreset:
    """How to run an engine: a container image and arguments (Kubernetes), a command
    (local backend), and the paths where it reports health and metrics."""

    image: str
    command: tuple[str, ...]
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    sleep_mode: bool = False  # it has /sleep and /wake_up (vLLM's sleep mode)


PRESETS: Mapping[Preset, EnginePreset] = {
    Preset.VLLM: EnginePreset(
        image="vllm/vllm-openai:v0.11.0",
        command=(
            "vllm",
            "serve",
            "{model}",
            "--served-model-name",
            "{name}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--enable-sleep-mode",
        ),
        sleep_mode=True,
    ),
    Preset.SGLANG: EnginePreset(
        image="lmsysorg/sglang:v0.5.3",
        command=(
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "{model}",
            "--served-model-name",
            "{name}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--enable-metrics",
        ),
    ),
    Preset.TGI: EnginePreset(
        image="ghcr.io/huggingface/text-generation-inference:3.3.6",
        command=(
            "text-generation-launcher",
            "--model-id",
            "{model}",
            "--hostname",
            "{host}",
            "--port",
            "{port}",
        ),
    ),
    Preset.TEST: EnginePreset(
        image="gpuportal/testengine",
        command=(
            sys.executable,
            "-m",
            "portal.inference.testengine",
            "--model-dir",
            "{model}",
            "--served-model-name",
            "{name}",
            "--host",
            "{host}",
            "--port",
            "{port}",
        ),
        sleep_mode=True,
    ),
}


@dataclass(frozen=True, slots=True)
class Engine:
    """The engine of every replica: a preset (its command, then ``args``), or ``custom``
    with its own ``command`` (and health and metrics paths)."""

    preset: Preset = Preset.VLLM
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    image: str | None = None
    health_path: str | None = None
    metrics_path: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.preset is Preset.CUSTOM and not self.command:
            raise InvalidRequest(
                "engine.command",
                "missing",
                "the program and its arguments with preset custom, e.g. "
                '["my-server", "--port", "{port}"]',
            )
        if self.preset is not Preset.CUSTOM and self.command:
            raise InvalidRequest(
                "engine.command", "set", f"empty with preset {self.preset.value} (use args)"
            )
        every = (*self.command, *self.args)
        if len(every) > MAX_ARGS or any(not a or "\x00" in a for a in every):
            raise InvalidRequest(
                "engine.args", f"{len(every)} arguments", f"at most {MAX_ARGS} non-empty strings"
            )
        if self.preset is Preset.CUSTOM and "{port}" not in " ".join(self.command):
            raise InvalidRequest(
                "engine.command",
                " ".join(self.command),
                "a command with {port}: each replica listens on its own",
            )
        for what, path in (("health_path", self.health_path), ("metrics_path", self.metrics_path)):
            if path is not None and (not path.startswith("/") or len(path) > 1024):
                raise InvalidRequest(f"engine.{what}", repr(path), "a path starting with /")
        for name, _value in self.env:
            if name in SERVICE_RESERVED_ENV:
                raise InvalidRequest(
                    f"engine.env.{name}", repr(name), "a name the portal does not set"
                )

    @property
    def resolved(self) -> EnginePreset:
        """The preset with this engine's overrides."""
        base = PRESETS.get(self.preset) or EnginePreset(image=self.image or "", command=())
        return EnginePreset(
            image=self.image or base.image,
            command=(self.command or base.command) + self.args,
            health_path=self.health_path or base.health_path,
            metrics_path=self.metrics_path or base.metrics_path,
            sleep_mode=base.sleep_mode,
        )


@dataclass(frozen=True, slots=True)
class Hold:
    """Requests the gateway holds while no replica is ready (scale from zero): at most
    ``max_requests`` at once, each for at most ``timeout_s``; beyond, 503 with Retry-After."""

    max_requests: int = 100
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.max_requests, bool) or not 0 <= self.max_requests <= 100_000:
            raise InvalidRequest("hold.max_requests", self.max_requests, "0 to 100000")
        if not 0 < self.timeout_s <= 3600:
            raise InvalidRequest("hold.timeout_s", self.timeout_s, "seconds above 0 to 3600")


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    tenant: str
    owner: str
    name: str
    engine: Engine
    model: ModelRef
    devices: DeviceRequest
    replicas: Replicas = field(default_factory=Replicas)
    scaling: ScalingRule = field(default_factory=ScalingRule)
    hold: Hold = field(default_factory=Hold)
    priority: int = 0

    def __post_init__(self) -> None:
        if not -MAX_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise InvalidRequest("priority", self.priority, f"{-MAX_PRIORITY} to {MAX_PRIORITY}")
        if self.devices.kind is None:
            raise InvalidRequest("devices.kind", "null", "gpu, mig or share: a replica needs a GPU")
        if self.scaling.warm_policy is WarmPolicy.FORECAST and not self.replicas.warm:
            raise InvalidRequest(
                "scaling.warm_policy",
                "forecast with replicas.warm 0",
                "fixed, or forecast with replicas.warm >= 1 (the planner's budget)",
            )

    @property
    def served_name(self) -> str:
        """The model's id in the OpenAI API: the service's name."""
        return self.name

    def check_backend(self, backend: Backend) -> None:
        """The local backend runs a command on weights its weight cache fetches from a
        ``file://``, ``http://`` or ``https://`` URI; Kubernetes needs an image."""
        if backend is Backend.LOCAL:
            check_fetchable(self.model.uri)
            return
        if not self.engine.resolved.image:
            raise InvalidRequest("engine.image", "missing", "a container image for Kubernetes")

    def check_quota(self, quotas: Sequence[QuotaRecord], models: frozenset[str]) -> None:
        """A replica's flavor must be one the tenant has quota for (some limit that holds one
        replica), on at least one of the candidate models."""
        dev = self.devices
        unknown = sorted(dev.models - models)
        if unknown:
            raise InvalidRequest(
                "devices.models",
                ", ".join(unknown),
                f"models of this cluster: {', '.join(sorted(models))}",
            )
        candidates = sorted(dev.models or models)
        limits = {q.flavor: q.limit for q in quotas if q.tenant == self.tenant}
        flavors = [str(dev.flavor(m)) for m in candidates]
        if any(limits.get(fl, 0) >= dev.amount() for fl in flavors):
            return
        allowed = sorted(fl for fl, limit in limits.items() if limit > 0)
        raise InvalidRequest(
            "devices",
            ", ".join(flavors) or "no model",
            f"a flavor {self.tenant} has quota for: {', '.join(allowed) or 'none'}",
        )

    def replica_ceiling(self, quotas: Sequence[QuotaRecord], models: frozenset[str]) -> int:
        """The most replicas the tenant's limit holds, over the candidate flavors."""
        dev = self.devices
        limits = {q.flavor: q.limit for q in quotas if q.tenant == self.tenant}
        per = max(1, dev.amount())
        return max(
            (limits.get(str(dev.flavor(m)), 0) // per for m in sorted(dev.models or models)),
            default=0,
        )

    # ---------------------------------------------------------------- stored as JSON

    def to_dict(self) -> dict[str, Any]:
        from portal.allocator import codec

        e, r, s = self.engine, self.replicas, self.scaling
        return {
            "engine": {
                "preset": e.preset.value,
                "args": list(e.args),
                "command": list(e.command),
                "image": e.image,
                "health_path": e.health_path,
                "metrics_path": e.metrics_path,
                "env": dict(e.env),
            },
            "model": {"uri": self.model.uri, "digest": self.model.digest},
            "devices": codec.device_request_to_dict(self.devices),
            "replicas": {"min": r.min, "max": r.max, "warm": r.warm},
            "scaling": {
                "metric": s.metric.value,
                "target": s.target,
                "up_window_s": s.up_window_s,
                "down_window_s": s.down_window_s,
                "idle_s": s.idle_s,
                "warm_policy": s.warm_policy.value,
            },
            "hold": {"max_requests": self.hold.max_requests, "timeout_s": self.hold.timeout_s},
            "priority": self.priority,
        }

    @classmethod
    def from_dict(cls, tenant: str, owner: str, name: str, d: Mapping[str, Any]) -> ServiceSpec:
        e, s = d["engine"], d["scaling"]
        return cls(
            tenant=tenant,
            owner=owner,
            name=name,
            engine=Engine(
                preset=Preset(e["preset"]),
                args=tuple(e["args"]),
                command=tuple(e["command"]),
                image=e["image"],
                health_path=e["health_path"],
                metrics_path=e["metrics_path"],
                env=tuple(sorted(e["env"].items())),
            ),
            model=ModelRef(d["model"]["uri"], d["model"]["digest"]),
            devices=device_request(d["devices"]),
            replicas=Replicas(**d["replicas"]),
            scaling=ScalingRule(
                metric=ScalingMetric(s["metric"]),
                target=float(s["target"]),
                up_window_s=float(s["up_window_s"]),
                down_window_s=float(s["down_window_s"]),
                idle_s=float(s["idle_s"]),
                # Stored before warm policies existed: fixed.
                warm_policy=WarmPolicy(s.get("warm_policy", WarmPolicy.FIXED.value)),
            ),
            hold=Hold(int(d["hold"]["max_requests"]), float(d["hold"]["timeout_s"])),
            priority=int(d["priority"]),
        )
