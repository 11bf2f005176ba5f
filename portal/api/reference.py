"""The API reference page, rendered from the app's generated OpenAPI document.

``python -m portal.api.reference`` writes ``docs/api-reference.md``; ``--check`` exits 1 when
the committed page differs from a fresh render, so the reference cannot drift from the code.
Everything on the page comes from ``create_app(...).openapi()``: operations, the scope each
requires (the ``security`` requirement that ``deps.requires`` declares), parameters, bodies,
responses and every component schema. The output is deterministic: no timestamps, stable order.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from portal.allocator import Allocator
from portal.api.app import create_app
from portal.api.auth import SCOPE_HELP, Scope, StaticAuthenticator

Schema = Mapping[str, Any]
"""One JSON Schema (or OpenAPI object) node."""

DEFAULT_OUT = Path("docs/api-reference.md")
COMMAND = "python -m portal.api.reference"
TAG_ORDER = (
    "tenants",
    "quotas",
    "workloads",
    "queue",
    "usage",
    "inventory",
    "offers",
    "cost",
    "telemetry",
    "alerts",
    "metrics",
    "health",
)
"""Sections in reading order; a tag not listed here follows them, alphabetically."""
METHOD_ORDER = ("get", "head", "post", "put", "patch", "delete", "options", "trace")
REF_PREFIX = "#/components/schemas/"
CODE_SPAN = re.compile(r"(`+[^`]*`+)")
TAG_START = re.compile(r"<(?=[A-Za-z/!?])")
BOUND_WORDS = (
    ("minimum", ">= {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "<= {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "length >= {}"),
    ("maxLength", "length <= {}"),
    ("minItems", "items >= {}"),
    ("maxItems", "items <= {}"),
    ("pattern", "matches `{}`"),
)


def openapi_document() -> dict[str, Any]:
    """The document the service serves at ``/api/v1/openapi.json``. Building it touches no
    allocator or token, so the app is made over neither."""
    return create_app(cast(Allocator, None), StaticAuthenticator({})).openapi()


def operation_scopes(operation: Schema) -> list[str]:
    """The scopes an operation requires, as its OpenAPI ``security`` requirement names them."""
    return [s for req in operation.get("security", []) for names in req.values() for s in names]


def operations(document: Schema) -> list[tuple[str, str, str, Schema]]:
    """(tag, METHOD, path, operation) of every operation, in page order: tags in
    ``TAG_ORDER``, then by path and method. An operation sits under its first tag."""
    out = []
    for path, item in document.get("paths", {}).items():
        for method, op in item.items():
            if method not in METHOD_ORDER:
                continue  # path-level "parameters", "summary", ...
            tags = op.get("tags") or ["other"]
            out.append((str(tags[0]), method.upper(), str(path), op))
    return sorted(out, key=lambda o: (_tag_rank(o[0]), o[2], METHOD_ORDER.index(o[1].lower())))


def _tag_rank(tag: str) -> tuple[int, str]:
    return (TAG_ORDER.index(tag), "") if tag in TAG_ORDER else (len(TAG_ORDER), tag)


def anchor(name: str) -> str:
    """The page anchor of a component schema (explicit, so it works on any Markdown host)."""
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def operation_anchor(method: str, path: str) -> str:
    return "op-" + re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


def cell(text: object) -> str:
    """``text`` on one line, safe inside a Markdown table cell; outside code spans, ``<n>``
    is escaped so that renderers do not take it for an HTML tag."""
    flat = " ".join(str(text).split()).replace("|", "\\|")
    parts = CODE_SPAN.split(flat)
    return "".join(p if i % 2 else TAG_START.sub("&lt;", p) for i, p in enumerate(parts))


def literal(value: object) -> str:
    return "`" + json.dumps(value, sort_keys=True) + "`"


def type_text(schema: Schema) -> str:
    """A schema's type in words: ``integer``, ``string (date-time)``, ``array of X``,
    ``map of string to X``, ``X or null``, links to component schemas."""
    if "$ref" in schema:
        name = str(schema["$ref"]).removeprefix(REF_PREFIX)
        return f"[{name}](#{anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(dict.fromkeys(type_text(s) for s in schema[key]))
    if "allOf" in schema:
        return " and ".join(type_text(s) for s in schema["allOf"])
    if "enum" in schema:
        return "one of " + ", ".join(literal(v) for v in schema["enum"])
    if "const" in schema:
        return literal(schema["const"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind == "array":
        return "array of " + type_text(schema.get("items", {}))
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        return "map of string to " + type_text(schema["additionalProperties"])
    if kind is None:
        return "any"
    return f"{kind} ({schema['format']})" if "format" in schema else str(kind)


def bounds_text(schema: Schema) -> str:
    """The schema's bounds (its own and those of its non-null alternatives), e.g.
    ``>= 0, <= 500``; empty when unbounded."""
    parts = []
    for node in _alternatives(schema):
        for key, form in BOUND_WORDS:
            if key in node:
                parts.append(form.format(_number(node[key])))
    return ", ".join(dict.fromkeys(parts))


def _alternatives(schema: Schema) -> Iterable[Schema]:
    yield schema
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            yield from _alternatives(sub)


def _number(value: object) -> str:
    # Pydantic writes integer bounds as floats (10000000.0); show them as written in code.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def default_text(schema: Schema, required: bool) -> str:
    if required:
        return "required"
    return literal(schema["default"]) if "default" in schema else "optional"


def scope_text(operation: Schema) -> str:
    scopes = operation_scopes(operation)
    if not operation.get("security"):
        return "none: answered without a token"
    words = []
    for name in scopes:
        help_text = SCOPE_HELP.get(Scope(name)) if name in {s.value for s in Scope} else None
        words.append(f"`{name}`" + (f" ({help_text})" if help_text else ""))
    return " and ".join(words) or "a valid token (no scope)"


def fields_table(schema: Schema, components: Mapping[str, Schema]) -> list[str]:
    """A table of an object schema's fields: name, type, required or default, bounds and
    description. Follows one ``$ref``."""
    schema = _resolve(schema, components)
    props: Mapping[str, Schema] = schema.get("properties", {})
    if not props:
        return []
    required = set(schema.get("required", []))
    rows = [
        "| field | type | required / default | bounds | description |",
        "|---|---|---|---|---|",
    ]
    for name, prop in props.items():
        rows.append(
            f"| `{name}` | {cell(type_text(prop))} | {cell(default_text(prop, name in required))}"
            f" | {cell(bounds_text(prop))} | {cell(prop.get('description', ''))} |"
        )
    return rows


def _resolve(schema: Schema, components: Mapping[str, Schema]) -> Schema:
    ref = schema.get("$ref")
    return components.get(str(ref).removeprefix(REF_PREFIX), schema) if ref else schema


def parameters_table(operation: Schema) -> list[str]:
    params: Sequence[Schema] = operation.get("parameters", [])
    if not params:
        return []
    rows = [
        "| parameter | in | type | required / default | bounds | description |",
        "|---|---|---|---|---|---|",
    ]
    for p in params:
        schema: Schema = p.get("schema", {})
        description = p.get("description") or schema.get("description", "")
        rows.append(
            f"| `{p['name']}` | {p['in']} | {cell(type_text(schema))}"
            f" | {cell(default_text(schema, bool(p.get('required'))))}"
            f" | {cell(bounds_text(schema))} | {cell(description)} |"
        )
    return rows


def content_text(content: Mapping[str, Schema]) -> str:
    """What a body carries: its schema per media type (JSON shown by schema alone)."""
    parts = []
    for media, body in sorted(content.items()):
        schema = body.get("schema")
        what = type_text(schema) if schema else ""
        parts.append(what if media == "application/json" and what else f"`{media}` {what}".strip())
    return "; ".join(parts)


def render_operation(method: str, path: str, op: Schema, components: Mapping[str, Schema]) -> str:
    lines = [f'<a id="{operation_anchor(method, path)}"></a>', f"### `{method} {path}`", ""]
    if op.get("summary"):
        lines += [cell(op["summary"]).rstrip(".") + ".", ""]
    if op.get("description"):
        lines += [cell(op["description"]), ""]
    lines += [f"Scope: {scope_text(op)}", ""]
    params = parameters_table(op)
    if params:
        lines += ["Parameters:", "", *params, ""]
    body = op.get("requestBody")
    if body:
        needed = "required" if body.get("required") else "optional"
        lines += [f"Request body ({needed}): {content_text(body.get('content', {}))}", ""]
        json_schema = body.get("content", {}).get("application/json", {}).get("schema")
        fields = fields_table(json_schema, components) if json_schema else []
        if fields:
            lines += [*fields, ""]
    responses: Mapping[str, Schema] = op.get("responses", {})
    if responses:
        lines += ["| status | meaning | body |", "|---|---|---|"]
        for status in sorted(responses):
            r = responses[status]
            body_text = content_text(r.get("content", {}))
            lines.append(f"| {status} | {cell(r.get('description', ''))} | {cell(body_text)} |")
        lines.append("")
    return "\n".join(lines)


def request_schemas(document: Schema) -> frozenset[str]:
    """Names of the component schemas a request body can contain, directly or nested."""
    components: Mapping[str, Schema] = document.get("components", {}).get("schemas", {})
    found: set[str] = set()
    todo: list[object] = [
        op["requestBody"] for _, _, _, op in operations(document) if "requestBody" in op
    ]
    while todo:
        node = todo.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(REF_PREFIX):
                name = ref.removeprefix(REF_PREFIX)
                if name not in found and name in components:
                    found.add(name)
                    todo.append(components[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return frozenset(found)


def render_schema(
    name: str, schema: Schema, components: Mapping[str, Schema], *, in_requests: bool
) -> str:
    lines = [f'<a id="{anchor(name)}"></a>', f"### {name}", ""]
    title = schema.get("title")
    if title and title != name:
        lines += [f"`{title}`", ""]
    if schema.get("description"):
        lines += [cell(schema["description"]), ""]
    if "enum" in schema:
        lines += [f"A {schema.get('type', 'value')}, " + type_text(schema) + ".", ""]
    fields = fields_table(schema, components)
    if fields:
        if in_requests and schema.get("additionalProperties") is False:
            lines += ["In a request, unknown fields are refused.", ""]
        lines += [*fields, ""]
    elif "enum" not in schema:
        lines += [f"Type: {type_text(schema)}.", ""]
    return "\n".join(lines)


def render(document: Schema) -> str:
    """The whole Markdown page for ``document``."""
    info: Schema = document.get("info", {})
    components: Mapping[str, Schema] = document.get("components", {}).get("schemas", {})
    schemes: Mapping[str, Schema] = document.get("components", {}).get("securitySchemes", {})
    out = [
        f"<!-- Generated from the OpenAPI document by `{COMMAND}`; do not edit by hand. -->",
        "",
        f"# {info.get('title', 'API')} API reference (v{info.get('version', '?')})",
        "",
    ]
    if info.get("summary"):
        out += [cell(info["summary"]).rstrip(".") + ".", ""]
    out += [
        "Every operation, parameter, body, response and schema the service serves, field by "
        "field; [api.md](api.md) says how the API behaves. Bounds are inclusive unless written "
        "with `>` or `<`.",
        "",
    ]
    for scheme_name, scheme in sorted(schemes.items()):
        where = f"header `{scheme['name']}`" if scheme.get("in") == "header" else scheme_name
        out += [f"Authentication ({scheme_name}, {where}): {cell(scheme.get('description', ''))}"]
        out += [""]
    ops = operations(document)
    out += ["## Operations", ""]
    for tag in dict.fromkeys(t for t, *_ in ops):
        out += [
            f"- {tag}: "
            + ", ".join(f"[`{m} {p}`](#{operation_anchor(m, p)})" for t, m, p, _ in ops if t == tag)
        ]
    out.append("")
    current = None
    for tag, method, path, op in ops:
        if tag != current:
            out += [f"## {tag}", ""]
            current = tag
        out.append(render_operation(method, path, op, components))
    out += ["## Schemas", ""]
    requested = request_schemas(document)
    for name in sorted(components):
        schema = components[name]
        out.append(render_schema(name, schema, components, in_requests=name in requested))
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Render the API reference from the generated OpenAPI document."
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when --out differs from a fresh render"
    )
    args = parser.parse_args(argv)
    page = render(openapi_document())
    out: Path = args.out
    if args.check:
        if not out.is_file() or out.read_text(encoding="utf-8") != page:
            state = "is missing" if not out.is_file() else "is out of date with the API"
            print(f"{out} {state}: run `{COMMAND} --out {out}`", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
