"""Flavors: what a request asks for and what a quota counts.

A flavor is one of
- a whole GPU of a model, named by the model (``H100-80GB``), counted in GPUs;
- a MIG profile of a model (``H100-80GB/3g.40gb``), counted in instances;
- a fractional share of a model (``T4/share``), counted in milli-GPU (1000 = one GPU).

GPU-equivalents make flavors comparable for fairness: a whole GPU is 1, a MIG instance is its
compute slices over the model's total compute slices, a share is milli / 1000.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from policies import mig
from policies.errors import InvalidRequest

SHARE_SUFFIX = "share"
MILLI_PER_GPU = 1000

_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,62}$")


class FlavorKind(StrEnum):
    """The three ways a GPU is handed out."""

    GPU = "gpu"
    MIG = "mig"
    SHARE = "share"


@dataclass(frozen=True, slots=True, order=True)
class Flavor:
    """A countable kind of GPU capacity. ``str(flavor)`` is its canonical name."""

    kind: FlavorKind
    model: str
    profile: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not _MODEL_RE.fullmatch(self.model):
            raise InvalidRequest(
                "flavor",
                self.model,
                "a GPU model name such as 'H100-80GB' (letters, digits, '.', '-')",
            )
        if (self.kind is FlavorKind.MIG) != (self.profile is not None):
            raise InvalidRequest(
                "flavor", str(self.profile), "a MIG profile exactly when the flavor kind is 'mig'"
            )
        if self.profile is not None:
            # Raises with the model's valid profiles (or the MIG-capable models) when unknown.
            mig.geometry(self.model).profile(self.profile)

    def __str__(self) -> str:
        if self.kind is FlavorKind.GPU:
            return self.model
        if self.kind is FlavorKind.MIG:
            return f"{self.model}/{self.profile}"
        return f"{self.model}/{SHARE_SUFFIX}"

    @property
    def unit(self) -> str:
        """The unit quotas of this flavor are counted in."""
        return {FlavorKind.GPU: "gpus", FlavorKind.MIG: "instances", FlavorKind.SHARE: "milli-gpu"}[
            self.kind
        ]

    @classmethod
    def parse(cls, name: str) -> Flavor:
        """Parse a canonical flavor name (``H100-80GB``, ``H100-80GB/3g.40gb``, ``T4/share``)."""
        if not isinstance(name, str) or not name:
            raise InvalidRequest(
                "flavor", repr(name), "'MODEL', 'MODEL/<mig profile>' or 'MODEL/share'"
            )
        model, sep, rest = name.partition("/")
        if not sep:
            return cls(FlavorKind.GPU, model)
        if rest == SHARE_SUFFIX:
            return cls(FlavorKind.SHARE, model)
        if not rest:
            raise InvalidRequest("flavor", name, "'MODEL', 'MODEL/<mig profile>' or 'MODEL/share'")
        return cls(FlavorKind.MIG, model, rest)
