"""Finding the portal and the token from the environment, as inside a JupyterHub notebook."""

from __future__ import annotations

import pytest

from portal.client import MissingConfiguration, Portal
from portal.client.config import resolve_token, resolve_url
from tests.portal.client.conftest import Served

VARS = ("GPUPORTAL_URL", "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_in_a_notebook_portal_needs_no_arguments(
    portal_server: Served, clean_env: pytest.MonkeyPatch
) -> None:
    # What the hub sets in a single-user server; the portal is its service "gpuportal".
    clean_env.setenv("JUPYTERHUB_API_URL", f"{portal_server.origin}/hub/api")
    clean_env.setenv("JUPYTERHUB_API_TOKEN", "alice")
    with Portal() as p:
        assert p.url == portal_server.url
        assert [t.name for t in p.tenants()] == ["team-a"]  # alice's view: the token was sent


def test_the_older_token_variable_and_an_explicit_url_work(
    portal_server: Served, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("JPY_API_TOKEN", "bob")
    clean_env.setenv("GPUPORTAL_URL", portal_server.url.rstrip("/"))
    clean_env.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:9/hub/api")  # GPUPORTAL_URL wins
    with Portal() as p:
        assert p.url == portal_server.url
        assert [t.name for t in p.tenants()] == ["team-b"]


def test_arguments_win_over_the_environment(
    portal_server: Served, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("GPUPORTAL_URL", "http://127.0.0.1:9/")
    clean_env.setenv("JUPYTERHUB_API_TOKEN", "bob")
    with Portal(portal_server.url, "alice") as p:
        assert [t.name for t in p.tenants()] == ["team-a"]


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({"GPUPORTAL_URL": "https://gpus.example.org/portal"}, "https://gpus.example.org/portal/"),
        ({"JUPYTERHUB_API_URL": "http://hub:8081/hub/api"}, "http://hub:8081/services/gpuportal/"),
        (
            {"JUPYTERHUB_API_URL": "https://x.org/jhub/hub/api/"},
            "https://x.org/jhub/services/gpuportal/",
        ),
        (
            {"JUPYTERHUB_API_URL": "http://10.0.0.1:8081/api"},
            "http://10.0.0.1:8081/services/gpuportal/",
        ),
    ],
)
def test_url_resolution(env: dict[str, str], url: str) -> None:
    assert resolve_url(None, env) == url


def test_token_resolution_prefers_the_current_variable() -> None:
    both = {"JUPYTERHUB_API_TOKEN": "new", "JPY_API_TOKEN": "old"}
    assert resolve_token(None, both) == "new"
    assert resolve_token(None, {"JPY_API_TOKEN": "old"}) == "old"
    assert resolve_token("given", both) == "given"


def test_nothing_found_names_the_variables_to_set() -> None:
    with pytest.raises(MissingConfiguration, match=r"GPUPORTAL_URL.*JUPYTERHUB_API_URL"):
        Portal(token="t")
    with pytest.raises(MissingConfiguration, match="JUPYTERHUB_API_TOKEN or JPY_API_TOKEN"):
        Portal("http://127.0.0.1:9/")
    with pytest.raises(MissingConfiguration, match=r"invalid portal URL 'gpus\.example\.org'"):
        Portal("gpus.example.org", "t")
