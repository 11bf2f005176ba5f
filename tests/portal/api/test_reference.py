"""The API reference page is generated from the OpenAPI document and kept in step with it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from portal.api import reference
from portal.api.app import PUBLIC_PATHS

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "api-reference.md"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return reference.openapi_document()


@pytest.fixture(scope="module")
def page(document: dict[str, Any]) -> str:
    return reference.render(document)


def section(page: str, method: str, path: str) -> str:
    """The page's text for one operation: from its anchor to the next anchor."""
    start = page.index(f'<a id="{reference.operation_anchor(method, path)}"></a>')
    end = page.find("<a id=", start + 1)
    return page[start : end if end != -1 else None]


def test_the_committed_reference_equals_a_fresh_render(page: str) -> None:
    assert COMMITTED.read_text(encoding="utf-8") == page, (
        f"{COMMITTED.name} is out of date with the API: regenerate it with "
        f"`{reference.COMMAND}` and commit it"
    )


def test_every_operation_appears_under_its_tag_with_its_scope(
    document: dict[str, Any], page: str
) -> None:
    ops = reference.operations(document)
    assert len(ops) >= 20
    for tag, method, path, op in ops:
        text = section(page, method, path)
        assert f"### `{method} {path}`" in text
        scopes = reference.operation_scopes(op)
        if path in PUBLIC_PATHS:
            assert "Scope: none" in text
        else:
            assert len(scopes) == 1, f"{method} {path} declares {scopes}"
            assert f"Scope: `{scopes[0]}`" in text
        # Under its tag: the nearest "## " heading above the operation names the tag.
        heading = re.findall(r"^## (\S+)$", page[: page.index(text)], flags=re.M)[-1]
        assert heading == tag


def test_a_scope_comes_from_the_routes_dependency(page: str) -> None:
    assert "Scope: `custom:gpuportal:admin`" in section(page, "PUT", "/api/v1/tenants/{tenant}")
    quota = section(page, "PUT", "/api/v1/tenants/{tenant}/quotas/{flavor}")
    assert "Scope: `custom:gpuportal:quotas:write` (change quotas" in quota


def test_parameters_body_fields_and_responses_carry_bounds_defaults_and_descriptions(
    page: str,
) -> None:
    listing = section(page, "GET", "/api/v1/workloads")
    assert "| `limit` | query | integer | `100` | >= 1, <= 500 | Page size, 1..500. |" in listing
    assert "| 200 | Successful Response | [Page_WorkloadOut_](#schema-page-workloadout) |" in (
        listing
    )
    put_quota = section(page, "PUT", "/api/v1/tenants/{tenant}/quotas/{flavor}")
    assert "Request body (required): [QuotaIn](#schema-quotain)" in put_quota
    assert "| `limit` | integer | required | >= 0, <= 10000000 | Units never exceeded;" in (
        put_quota
    )


def test_schema_fields_show_description_bounds_and_enum_values(page: str) -> None:
    schemas = page[page.index("## Schemas") :]
    quota_in = schemas[schemas.index('<a id="schema-quotain">') :]
    assert (
        "| `budget_gpu_hours` | number or null | optional | >= 0, <= 1000000000 "
        "| GPU-hours per calendar month; null: no budget. |"
    ) in quota_in
    assert '`"queued"`, `"running"`, `"preempting"`' in schemas


def test_every_component_schema_has_one_section_and_links_resolve(
    document: dict[str, Any], page: str
) -> None:
    names = document["components"]["schemas"]
    anchors = re.findall(r'<a id="([^"]+)"></a>', page)
    assert len(anchors) == len(set(anchors)), "two headings share an anchor"
    for name in names:
        assert f'<a id="{reference.anchor(name)}"></a>\n### {name}\n' in page
    assert set(re.findall(r"\]\(#([^)]+)\)", page)) <= set(anchors)


def test_check_exits_1_naming_the_command_when_the_file_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "api-reference.md"
    assert reference.main(["--out", str(out), "--check"]) == 1
    assert reference.main(["--out", str(out)]) == 0
    assert reference.main(["--out", str(out), "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace("<= 500", "<= 501"), encoding="utf-8")
    capsys.readouterr()
    assert reference.main(["--out", str(out), "--check"]) == 1
    message = capsys.readouterr().err.strip()
    assert message == f"{out} is out of date with the API: run `{reference.COMMAND} --out {out}`"
    assert "\n" not in message


def test_rendering_is_deterministic(document: dict[str, Any], page: str) -> None:
    assert reference.render(reference.openapi_document()) == page
    assert not re.search(r"\d{4}-\d{2}-\d{2}T\d{2}:", page), "no timestamps"


def test_a_cell_stays_on_one_line_and_escapes_pipes_and_tags_outside_code() -> None:
    text = "Where: node:<n>,\n a `token <t>` | b"
    assert reference.cell(text) == "Where: node:&lt;n>, a `token <t>` \\| b"


def test_only_request_schemas_say_unknown_fields_are_refused(
    document: dict[str, Any], page: str
) -> None:
    requested = reference.request_schemas(document)
    assert {"QuotaIn", "WorkloadIn", "DevicesIn"} <= requested  # DevicesIn: nested
    assert "WorkloadOut" not in requested
    schemas = page[page.index("## Schemas") :]
    blocks = dict(re.findall(r"### (\S+)\n\n(.*?)(?=<a id=|\Z)", schemas, flags=re.S))
    refused = {name for name, text in blocks.items() if "unknown fields are refused" in text}
    closed = {n for n in requested if "properties" in document["components"]["schemas"][n]}
    assert refused == closed
