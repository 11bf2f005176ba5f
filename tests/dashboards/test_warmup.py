"""The process warm-up renders what a first page would, in a fresh interpreter (imports are
per process)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
from dashboards.warmup import warm_up
first_use = ("matplotlib.figure",)
before = [m for m in first_use if m in sys.modules]
seconds = warm_up()
after = [m for m in first_use if m in sys.modules]
print(before, after, seconds > 0)
"""


def test_warm_up_pays_the_first_page_imports() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=True
    ).stdout.strip()
    # Panel's search for a string's pane type imported matplotlib's figure module (the
    # largest first-use cost of a page) during the warm-up, not on the first visitor's page.
    assert out.splitlines()[-1] == "[] ['matplotlib.figure'] True"
