"""Typed settings of gpuportal, read from ``GPUPORTAL_``-prefixed environment variables.

Every field has a description; ``load_settings`` turns validation failures into
``InvalidRequest`` so the CLI reports them like any other bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from policies.errors import InvalidRequest

ENV_PREFIX = "GPUPORTAL_"


class Settings(BaseSettings):
    """Settings of one gpuportal installation.

    Relative paths are resolved against the current directory when the settings are loaded.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    state_dir: Path = Field(
        default=Path(".run/demo"),
        description=(
            "Directory for local state: the hub configuration, its SQLite databases, cookie "
            "secret and the demo users' home directories. Created on first use."
        ),
    )
    database_url: str = Field(
        default="",
        description=(
            "SQLAlchemy URL of the portal's database. Empty means SQLite at "
            "<state_dir>/portal.sqlite (the embedded default); PostgreSQL for production, "
            "e.g. postgresql+psycopg://user@host/gpuportal."
        ),
    )
    demo_ip: str = Field(
        default="127.0.0.1",
        description="Address of the demo's public proxy; 0.0.0.0 exposes it to the network.",
    )
    demo_port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="TCP port of the demo's public proxy (the URL users open).",
    )
    demo_password: SecretStr | None = Field(
        default=None,
        description=(
            "Shared password of the demo users. Unset means a random one, generated once and "
            "kept in <state_dir>/demo-password."
        ),
    )

    @model_validator(mode="after")
    def _resolve_paths(self) -> Settings:
        # The model is frozen; object.__setattr__ is the sanctioned way to fill derived values
        # in an "after" validator.
        state_dir = self.state_dir.expanduser().resolve()
        object.__setattr__(self, "state_dir", state_dir)
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{state_dir / 'portal.sqlite'}")
        return self


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment; ``overrides`` (e.g. CLI flags) win over it.

    Raises:
        InvalidRequest: a value (from the environment or an override) is not valid.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        source = f"{name} (command line)" if name in given else f"{ENV_PREFIX}{name.upper()}"
        raise InvalidRequest(
            f"setting {source}", repr(first.get("input")), _valid(first["msg"])
        ) from exc


def _valid(message: str) -> str:
    # pydantic says "Input should be a valid integer"; InvalidRequest says "expected ...".
    prefix = "Input should be "
    return message[len(prefix) :] if message.startswith(prefix) else message
