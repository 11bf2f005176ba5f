"""What a training job is: a frozen value checked on construction, stored as JSON.

A job runs ``members`` processes (local backend: ``command`` in ``cwd``; Kubernetes: pods of
``image``), each with ``devices``, placed as one gang at the topology ``level`` (``required``
waits for it, ``preferred`` relaxes to ``any``). Every check raises ``InvalidRequest`` naming
the field as the API's body spells it (``members``, ``devices.count``, ``topology.level``,
``command``...), so a bad job is a 422 that names what to fix and nothing is created.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from policies.elastic import MemberBounds
from policies.errors import InvalidRequest
from policies.flavors import FlavorKind
from policies.jobs import RestartPolicy, TopologyMode
from policies.requests import MAX_GANG_SIZE, MAX_PRIORITY, DeviceRequest, TopologyRequirement
from portal.allocator import codec
from portal.allocator.memory import Memory

MAX_ARGS = 256
MAX_ENV = 256
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

RESERVED_ENV = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NNODES",
        "NODE_RANK",
        "TORCHELASTIC_RUN_ID",
        "CUDA_VISIBLE_DEVICES",
        "GPUPORTAL_JOB_ID",
        "GPUPORTAL_ATTEMPT",
        "GPUPORTAL_CHECKPOINT_DIR",
        "GPUPORTAL_RESUME_FROM",
    }
)
"""Variables the portal sets for every member (``docs/training-contract.md``): a job may not
set them itself."""


class Backend(StrEnum):
    """Where members run: processes on this host, or pods of an indexed Job."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


# The field names DeviceRequest's own checks use, as the API body spells them.
_DEVICE_FIELDS = {
    "GPU count": "devices.count",
    "MIG request": "devices.mig_profile",
    "MIG request models": "devices.models",
    "MIG profile": "devices.mig_profile",
    "GPU share": "devices.milli",
    "GPU memory share": "devices.gpu_memory_mib",
    "GPU share request": "devices",
    "GPU model": "devices.models",
    "MIG-capable model": "devices.models",
    "topology": "topology.level",
    "devices.topology": "topology.level",
    "cpu/memory": "devices.cpu_milli",
    "gpu_memory_mib": "devices.gpu_memory_mib",
    "cpu_milli": "devices.cpu_milli",
    "memory_mib": "devices.memory_mib",
    "request": "devices",
}


def api_field(exc: InvalidRequest) -> InvalidRequest:
    """``exc`` with its field named as the job body names it (``GPU count`` →
    ``devices.count``); unchanged when it already is."""
    named = _DEVICE_FIELDS.get(exc.field)
    if named is None:
        return exc
    return InvalidRequest(named, exc.value, exc.valid)


def device_request(data: Mapping[str, Any]) -> DeviceRequest:
    """A member's devices from the body's ``devices`` (plus the job's topology level)."""
    try:
        return codec.device_request_from_dict(dict(data))
    except InvalidRequest as exc:
        raise api_field(exc) from None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job as submitted. Null/empty means: ``cwd`` the portal's working directory,
    ``image`` none (local backend), ``checkpoint_dir`` none (no resume)."""

    tenant: str
    owner: str
    name: str
    members: int
    devices: DeviceRequest
    topology_mode: TopologyMode = TopologyMode.REQUIRED
    command: tuple[str, ...] = ()
    cwd: str | None = None
    image: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    checkpoint_dir: str | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    priority: int = 0
    expected_duration_s: float | None = None
    kube_job: str | None = None
    """``namespace/name`` of a Job created with kubectl that this job admits and runs (set by
    the Kubernetes backend's admission, never by the API)."""
    max_members: int | None = None
    """Elastic jobs: the most members it may grow to (``members`` is then its minimum, the
    gang it starts with); None: a fixed job of ``members``."""

    def __post_init__(self) -> None:
        if self.max_members is not None:  # elastic: members is the bound's min
            MemberBounds(self.members, self.max_members)
        if isinstance(self.members, bool) or not 1 <= self.members <= MAX_GANG_SIZE:
            raise InvalidRequest("members", self.members, f"1 to {MAX_GANG_SIZE}")
        if not -MAX_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise InvalidRequest("priority", self.priority, f"{-MAX_PRIORITY} to {MAX_PRIORITY}")
        if not self.name or len(self.name) > 253:
            raise InvalidRequest("name", repr(self.name), "1 to 253 characters")
        if len(self.command) > MAX_ARGS or any(not a or "\x00" in a for a in self.command):
            raise InvalidRequest(
                "command", f"{len(self.command)} arguments", f"1 to {MAX_ARGS} non-empty strings"
            )
        for what, path in (("cwd", self.cwd), ("checkpoint_dir", self.checkpoint_dir)):
            if path is not None and not path.startswith("/"):
                raise InvalidRequest(what, repr(path), "an absolute path")
        if len(self.env) > MAX_ENV:
            raise InvalidRequest("env", f"{len(self.env)} variables", f"at most {MAX_ENV}")
        for name, _value in self.env:
            if not ENV_NAME.fullmatch(name):
                raise InvalidRequest(
                    f"env.{name}", repr(name), "a variable name: letters, digits and _"
                )
            if name in RESERVED_ENV:
                raise InvalidRequest(
                    f"env.{name}",
                    repr(name),
                    "a name the portal does not set itself: not one of "
                    + ", ".join(sorted(RESERVED_ENV)),
                )

    @property
    def bounds(self) -> MemberBounds | None:
        """The members bound of an elastic job; None for a fixed one."""
        if self.max_members is None:
            return None
        return MemberBounds(self.members, self.max_members)

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.env)

    def check_backend(self, backend: Backend) -> None:
        """The job carries what ``backend`` runs: a command locally, an image on Kubernetes."""
        if backend is Backend.LOCAL and not self.command:
            raise InvalidRequest(
                "command",
                "missing",
                'the program and its arguments, e.g. ["python", "train.py"]: the local '
                "backend runs members as processes",
            )
        if backend is Backend.KUBERNETES and self.max_members is not None:
            raise InvalidRequest(
                "members",
                f"{{min: {self.members}, max: {self.max_members}}}",
                "a number of members: elastic jobs run on the local backend only",
            )
        if backend is Backend.KUBERNETES and not self.image:
            raise InvalidRequest(
                "image", "missing", "a container image: the Kubernetes backend runs pods"
            )
        if backend is Backend.KUBERNETES and (self.checkpoint_dir or "x").rstrip("/") == "":
            # The checkpoint volume is mounted there, and a volume cannot replace the root.
            raise InvalidRequest(
                "checkpoint_dir", repr(self.checkpoint_dir), "an absolute path other than /"
            )

    def relaxed(self) -> DeviceRequest:
        """The devices with the gang's topology level dropped to ``any`` (a preferred level
        that did not fit). ``nvlink`` stays: it is each member's own GPUs, not the gang's."""
        if self.devices.topology is TopologyRequirement.NVLINK:
            return self.devices
        return replace(self.devices, topology=TopologyRequirement.ANY)

    # ---------------------------------------------------------------- stored as JSON

    def to_dict(self) -> dict[str, Any]:
        r = self.restart
        admitted: dict[str, Any] = {"kube_job": self.kube_job} if self.kube_job is not None else {}
        if self.max_members is not None:
            admitted["max_members"] = self.max_members
        return {
            "members": self.members,
            "devices": codec.device_request_to_dict(self.devices),
            "topology_mode": self.topology_mode.value,
            "command": list(self.command),
            "cwd": self.cwd,
            "image": self.image,
            "env": dict(self.env),
            "checkpoint_dir": self.checkpoint_dir,
            "restart": {
                "max_restarts": r.max_restarts,
                "backoff_s": r.backoff_s,
                "backoff_cap_s": r.backoff_cap_s,
                "fail_on_exit_codes": sorted(r.fail_on_exit_codes),
            },
            "priority": self.priority,
            "expected_duration_s": self.expected_duration_s,
            **admitted,
        }

    @classmethod
    def from_dict(cls, tenant: str, owner: str, name: str, data: Mapping[str, Any]) -> JobSpec:
        r = data["restart"]
        return cls(
            tenant=tenant,
            owner=owner,
            name=name,
            members=data["members"],
            devices=device_request(data["devices"]),
            topology_mode=TopologyMode(data["topology_mode"]),
            command=tuple(data["command"]),
            cwd=data["cwd"],
            image=data["image"],
            env=tuple(sorted(data["env"].items())),
            checkpoint_dir=data["checkpoint_dir"],
            restart=RestartPolicy(
                max_restarts=r["max_restarts"],
                backoff_s=float(r["backoff_s"]),
                backoff_cap_s=float(r["backoff_cap_s"]),
                fail_on_exit_codes=frozenset(r["fail_on_exit_codes"]),
            ),
            priority=data["priority"],
            expected_duration_s=data["expected_duration_s"],
            kube_job=data.get("kube_job"),  # absent in jobs stored before it existed
            max_members=data.get("max_members"),  # absent: a fixed job
        )


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """What the inventory can hold, for the checks no wait would ever fix: units of each
    flavor in the whole cluster, and the most GPUs of each model on one node."""

    capacity: Mapping[str, int]
    max_gpus_per_node: Mapping[str, int]
    models: frozenset[str]

    @staticmethod
    def of(state: Memory) -> ClusterFacts:
        """The allocator's inventory facts (read under its lock: ``Allocator.read``)."""
        facts = state.facts()
        return ClusterFacts(
            capacity=dict(state.capacity()),
            max_gpus_per_node={m: f.gpus for m, f in facts.per_model.items()},
            models=facts.models,
        )


def fits_cluster(spec: JobSpec, facts: ClusterFacts) -> None:
    """Refuse a world size no cluster state could ever hold (it would wait forever): more
    members' worth of a flavor than the whole inventory has, or a ``same-node`` gang bigger
    than the largest node. Unknown models are named by the allocator's own check."""
    dev = spec.devices
    if dev.kind is None:
        return
    models = sorted(dev.models or facts.models)
    flavors = [str(dev.flavor(m)) for m in models]
    known = [(m, fl) for m, fl in zip(models, flavors, strict=True) if fl in facts.capacity]
    if not known:
        return
    need = dev.amount() * spec.members
    most = max(facts.capacity[fl] for _m, fl in known)
    if need > most:
        per = dev.amount()
        raise InvalidRequest(
            "members",
            spec.members,
            f"at most {most // per} members of {dev.amount()} x {known[0][1]}: the whole "
            f"cluster holds {most}",
        )
    if dev.topology is TopologyRequirement.SAME_NODE and spec.topology_mode is (
        TopologyMode.REQUIRED
    ):
        biggest = max(facts.max_gpus_per_node.get(m, 0) for m, _fl in known)
        gpus = dev.gpus * spec.members
        if dev.kind is FlavorKind.GPU and gpus > biggest:
            raise InvalidRequest(
                "members",
                spec.members,
                f"at most {biggest // max(1, dev.gpus)} members with topology same-node "
                f"(the largest node has {biggest} GPUs), or topology mode preferred",
            )
