"""kwok's pod Stages for the test cluster: the pinned ``fast`` set, with Job pods that a test
can keep running or fail.

The fast set completes a Running pod owned by a Job at once. The derived set keeps that as the
default and adds two annotations a test (or the benchmark) puts on a Job's pod template or on
its pods before they are bound, standing in for what the container would do:

- ``RUN_FOR`` (a Go duration: ``200ms``, ``1h``): how long the pod runs before it ends;
- ``EXIT_CODE`` (1..255): the pod then fails with this exit code instead of succeeding.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

RUN_FOR = "kwok.gpuportal.test/run-for"
EXIT_CODE = "kwok.gpuportal.test/exit-code"
COMPLETE = "pod-complete"


def _annotation(key: str) -> str:
    return f'.metadata.annotations["{key}"]'


def derive(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fast stages with ``pod-complete`` delayed by ``RUN_FOR`` and skipped for pods
    carrying ``EXIT_CODE``, plus ``pod-fail`` for those; the input is unchanged."""
    out = [copy.deepcopy(s) for s in stages]
    complete = next((s for s in out if s["metadata"]["name"] == COMPLETE), None)
    if complete is None:
        raise ValueError(f"kwok stages without {COMPLETE!r}: the pinned fast set changed")
    spec = complete["spec"]
    spec["delay"] = {
        "durationMilliseconds": 0,
        "durationFrom": {"expressionFrom": _annotation(RUN_FOR)},
    }
    fail = copy.deepcopy(complete)
    fail["metadata"]["name"] = "pod-fail"
    spec["selector"]["matchExpressions"].append(
        {"key": _annotation(EXIT_CODE), "operator": "DoesNotExist"}
    )
    fail["spec"]["selector"]["matchExpressions"].append(
        {"key": _annotation(EXIT_CODE), "operator": "Exists"}
    )
    # Inside the template's loop over containers ``.`` is the container: ``$root`` the pod.
    code = f'{{{{ index $root.metadata.annotations "{EXIT_CODE}" }}}}'
    fail["spec"]["next"]["statusTemplate"] = (
        fail["spec"]["next"]["statusTemplate"]
        .replace("exitCode: 0", f"exitCode: {code}")
        .replace("reason: Completed", "reason: Error")
        .replace("phase: Succeeded", "phase: Failed")
    )
    out.append(fail)
    return out


def write_derived(source: Path, target: Path) -> Path:
    """Write the derived stages of the stage file ``source`` to ``target``."""
    stages = [s for s in yaml.safe_load_all(source.read_text()) if s]
    target.write_text(yaml.safe_dump_all(derive(stages), sort_keys=False))
    return target
