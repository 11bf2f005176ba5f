"""What a string at the API boundary may hold: one rule per kind of string, applied to every
path, query and body string, the same on SQLite and PostgreSQL.

PostgreSQL refuses a NUL byte in text (and a lone UTF-16 surrogate cannot be encoded), so such
a value reaching the database fails the statement and drops the connection; SQLite stores it.
Checking here gives both databases the same answer: 422 naming the field, the value (escaped)
and what would be valid. Each rule is also written into the OpenAPI document (``pattern``,
``minLength``, ``maxLength``), so clients and the fuzz tests see the bounds the server keeps.

Use a rule as ``Annotated`` metadata of the string itself, ``Annotated[str, KEY]`` (or an alias
below: ``Label``, ``Key``...), inside ``| None``, ``list[...]`` and ``Query``/``Path``/``Header``:
``Annotated[Label | None, Query(description=...)]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

ERROR_TYPE = "string_rule"
"""The pydantic error type of a string that breaks its rule."""


@dataclass(frozen=True, slots=True)
class StringRule:
    """Strings of ``min_length`` to ``max_length`` characters matching ``pattern`` (a regular
    expression that Python and JSON Schema read alike); ``valid`` says so in words."""

    pattern: str
    max_length: int
    valid: str
    min_length: int = 1
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(self.pattern))

    def check(self, value: str) -> str:
        if not self.min_length <= len(value) <= self.max_length or not self._regex.fullmatch(value):
            raise PydanticCustomError(ERROR_TYPE, "{valid}", {"valid": self.expected})
        return value

    @property
    def expected(self) -> str:
        lo, hi = self.min_length, self.max_length
        length = f"up to {hi} characters" if lo <= 1 else f"{lo} to {hi} characters"
        return f"{self.valid}, {length}"

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler.resolve_ref_schema(handler(schema))
        out.update(pattern=self.pattern, minLength=self.min_length, maxLength=self.max_length)
        return out


LABEL = StringRule(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    63,
    "a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter "
    "or digit",
)
"""Tenants (JupyterHub group names) and cohorts."""

POOL = StringRule(
    r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    63,
    "a Kubernetes label value: letters, digits, '-', '_' and '.', starting and ending with a "
    "letter or digit",
)
"""Node pools: the value of a node's ``gpuportal.io/pool`` label."""

KEY = StringRule(
    r"^[!-~]+$",
    253,
    "printable ASCII without spaces",
)
"""Identifiers: workload ids, flavors, GPU models, MIG profiles, devices, nodes, rules."""

GENERATED_ID = StringRule(r"^[0-9a-f]{32}$", 32, "32 lowercase hex digits", min_length=32)
"""Ids the portal makes (``uuid4().hex``): a path segment of this shape can never be one of the
fixed segments beside it (``/ray/jobs``, ``/ray/costs``, ``/services/cache``)."""

TEXT = StringRule(
    r"^[^\u0000-\u001f\u007f-\u009f\ud800-\udfff]+$",
    253,
    "text without control characters (no NUL, tab or newline) or lone surrogates",
)
"""Names for people and user names: any printable Unicode."""

HEADER = StringRule(r"^[ -~]+$", 255, "printable ASCII")
"""Free-form header values (``Idempotency-Key``)."""


def bounded(rule: StringRule, max_length: int) -> StringRule:
    """``rule`` with a smaller ``max_length`` (an id column's width, a query's bound)."""
    return StringRule(rule.pattern, max_length, rule.valid, rule.min_length)


Label = Annotated[str, LABEL]
Pool = Annotated[str, POOL]
Key = Annotated[str, KEY]
Text = Annotated[str, TEXT]


def rule_of(metadata: list[Any]) -> StringRule | None:
    """The string rule among a field's ``Annotated`` metadata, or None."""
    return next((m for m in metadata if isinstance(m, StringRule)), None)
