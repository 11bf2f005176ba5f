"""Where the service listens and who may call it: settings, the hub's environment, tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from policies.errors import InvalidRequest
from portal.api.auth import CallerKind, HubAuthenticator, StaticAuthenticator
from portal.service import tokens
from portal.service.server import plan
from portal.settings import load_settings

TOKEN = "a-token-long-enough-1234"


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    owner = {"name": "prom", "kind": "service", "scopes": ["custom:gpuportal:metrics:read"]}
    path.write_text(yaml.safe_dump({"tokens": {TOKEN: owner}}))
    return path


HUB_ENV = {
    "JUPYTERHUB_API_TOKEN": "secret",
    "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api",
    "JUPYTERHUB_SERVICE_URL": "http://10.0.0.5:9000",
    "JUPYTERHUB_SERVICE_PREFIX": "/services/gpuportal/",
}


def test_under_the_hub_it_takes_address_prefix_and_token_checks_from_the_hub() -> None:
    p = plan(load_settings(), HUB_ENV)
    assert (p.ip, p.port, p.prefix) == ("10.0.0.5", 9000, "/services/gpuportal/")
    assert isinstance(p.authenticator, HubAuthenticator)


def test_settings_win_over_the_hub_environment(tokens_file: Path) -> None:
    settings = load_settings(
        service_ip="0.0.0.0", service_port=8123, service_prefix="/x", tokens_file=tokens_file
    )
    p = plan(settings, HUB_ENV)
    assert (p.ip, p.port, p.prefix) == ("0.0.0.0", 8123, "/x/")
    # Static tokens first, then the hub.
    caller = p.authenticator(TOKEN)
    assert caller is not None and (caller.name, caller.kind) == ("prom", CallerKind.SERVICE)


def test_standalone_defaults_with_a_tokens_file(tokens_file: Path) -> None:
    p = plan(load_settings(tokens_file=tokens_file), {})
    assert (p.ip, p.port, p.prefix) == ("127.0.0.1", 8090, "/")
    assert isinstance(p.authenticator, StaticAuthenticator)
    assert p.authenticator("unknown-token-0000000") is None


def test_without_a_tokens_file_or_a_hub_it_refuses_to_serve() -> None:
    with pytest.raises(InvalidRequest, match=r"GPUPORTAL_TOKENS_FILE.*never served without"):
        plan(load_settings(), {"JUPYTERHUB_API_URL": "http://hub/api"})  # no hub token


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://:80", "nonsense"])
def test_a_malformed_hub_service_url_is_named(url: str) -> None:
    with pytest.raises(InvalidRequest, match="JUPYTERHUB_SERVICE_URL"):
        plan(load_settings(), {**HUB_ENV, "JUPYTERHUB_SERVICE_URL": url})


@pytest.mark.parametrize("prefix", ["services/x", "/a//b"])
def test_a_prefix_must_be_an_absolute_path(prefix: str) -> None:
    with pytest.raises(InvalidRequest, match="GPUPORTAL_SERVICE_PREFIX"):
        plan(load_settings(service_prefix=prefix), HUB_ENV)


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ("tokens: []", "a mapping with key tokens"),
        ("tokens: {short: {name: x}}", "16\\+ characters"),
        (f"tokens: {{{TOKEN}: {{name: x, kind: robot}}}}", "kind"),
        (f"tokens: {{{TOKEN}: {{name: x, scopes: admin}}}}", "scopes"),
        (f"tokens: {{{TOKEN}: [x]}}", "name, kind, scopes, groups"),
    ],
)
def test_a_bad_tokens_file_names_the_entry_and_never_shows_a_token(
    tmp_path: Path, doc: str, names: str
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(doc)
    with pytest.raises(InvalidRequest, match=names) as err:
        tokens.load(path)
    assert TOKEN not in str(err.value)


def test_the_placement_policy_defaults_to_gpuportal_and_names_the_valid_ones() -> None:
    from policies.placement.scorers import POLICIES
    from portal.settings import SERVICE_POLICIES

    assert load_settings().placement_policy == "gpuportal"
    assert load_settings(placement_policy="binpack").placement_policy == "binpack"
    # Every named policy the service can build without a trace's distribution is offered.
    assert set(SERVICE_POLICIES) == set(POLICIES) - {"fgd"}
    with pytest.raises(InvalidRequest, match=r"placement_policy.*'fgd'.*one of gpuportal, binpack"):
        load_settings(placement_policy="fgd")
