"""What a Ray job is: an entrypoint (a shell command line run as the Ray driver) with a
runtime environment (``working_dir``, ``env_vars``) and the submitter's metadata; a frozen
value checked on construction, stored as JSON.

``pip`` (and every other runtime-environment key) is refused: the local backend runs only the
Ray installed beside the portal, and installing packages per job would change that shared
environment for every tenant. Tenants bring packages in an environment of their own (a
notebook's kernel, or a ``working_dir`` with pure-Python modules).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.errors import InvalidRequest
from portal.jobs.spec import ENV_NAME, MAX_ENV, RESERVED_ENV

MAX_ENTRYPOINT = 16_384
MAX_METADATA = 64

RAY_RESERVED_ENV = (
    frozenset({"RAY_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"})
    | RESERVED_ENV
)
"""Variables the portal sets for the driver itself: the head's address, the runtime
environment Ray hands to the job's tasks, and (on Kubernetes) the cluster's token."""


@dataclass(frozen=True, slots=True)
class RayJobSpec:
    """A Ray job as submitted. ``working_dir`` None: the portal's state directory for Ray
    jobs; else an existing directory on the portal's host (local backend)."""

    entrypoint: str
    working_dir: str | None = None
    env_vars: tuple[tuple[str, str], ...] = ()
    metadata: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.entrypoint.strip() or len(self.entrypoint) > MAX_ENTRYPOINT:
            raise InvalidRequest(
                "entrypoint", repr(self.entrypoint[:80]), f"a command line, 1 to {MAX_ENTRYPOINT}"
            )
        if "\x00" in self.entrypoint:
            raise InvalidRequest("entrypoint", "a NUL byte", "text without NUL")
        if self.working_dir is not None:
            where = Path(self.working_dir)
            if not where.is_absolute() or not where.is_dir():
                raise InvalidRequest(
                    "runtime_env.working_dir",
                    repr(self.working_dir),
                    "an existing directory on the portal's host, as an absolute path",
                )
        if len(self.env_vars) > MAX_ENV:
            raise InvalidRequest(
                "runtime_env.env_vars", f"{len(self.env_vars)} variables", f"at most {MAX_ENV}"
            )
        for name, _ in self.env_vars:
            if not ENV_NAME.fullmatch(name) or name in RAY_RESERVED_ENV:
                raise InvalidRequest(
                    f"runtime_env.env_vars.{name}",
                    repr(name),
                    "a variable name (letters, digits, _) the portal does not set itself: not "
                    + ", ".join(sorted(RAY_RESERVED_ENV)),
                )
        if len(self.metadata) > MAX_METADATA:
            raise InvalidRequest(
                "metadata", f"{len(self.metadata)} entries", f"at most {MAX_METADATA}"
            )

    def runtime_env(self) -> dict[str, Any]:
        """The runtime environment Ray applies to the job's tasks (through the driver)."""
        env: dict[str, Any] = {}
        if self.working_dir is not None:
            env["working_dir"] = self.working_dir
        if self.env_vars:
            env["env_vars"] = dict(self.env_vars)
        return env

    def to_dict(self) -> dict[str, Any]:
        return {
            "entrypoint": self.entrypoint,
            "runtime_env": self.runtime_env(),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RayJobSpec:
        env = data.get("runtime_env") or {}
        return cls(
            entrypoint=data["entrypoint"],
            working_dir=env.get("working_dir"),
            env_vars=tuple(sorted((env.get("env_vars") or {}).items())),
            metadata=tuple(sorted((data.get("metadata") or {}).items())),
        )
