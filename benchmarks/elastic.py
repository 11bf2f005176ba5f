"""Elastic jobs: the seeded sequence of random grow/shrink/reclaim events of
``tests/portal/jobs/test_elastic_random.py``, at full length, with the invariant checked after
every event (the charged slices of each elastic job equal its members beyond ``min``).

    python -m benchmarks.elastic --events 10000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tests.portal.jobs.test_elastic_random import SEED, run_events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started, cpu = time.monotonic(), time.process_time()
        seen = run_events(Path(tmp), args.events, args.seed)
        wall, used = time.monotonic() - started, time.process_time() - cpu
    print(f"{args.events} events, seed {args.seed}: invariant held after every one")
    print(f"wall {wall:.1f} s, CPU {used:.1f} s, load average {os.getloadavg()[0]:.1f}")
    print("events and sizes seen:", dict(sorted(seen.items())))


if __name__ == "__main__":
    main()
