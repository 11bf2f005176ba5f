"""The CLI runs against the same live portal as the client tests (uvicorn on loopback)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from portal.cli import run
from tests.portal.client.conftest import Served, allocator, portal_server

__all__ = ["allocator", "portal_server"]

ENV = ("GPUPORTAL_URL", "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN")


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


Gpuportal = Callable[..., Ran]


@pytest.fixture
def gpuportal(
    portal_server: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Gpuportal:
    """``gpuportal("quotas", "--json", token="anna")``: ``portal.cli.run`` against the live
    portal, with the URL and token in the environment as in a notebook."""
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GPUPORTAL_URL", portal_server.url)

    def gp(*args: str, token: str = "root") -> Ran:
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
        capsys.readouterr()
        code = run(list(args))
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return gp
