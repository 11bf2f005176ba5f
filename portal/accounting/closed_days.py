"""Exact cost lines of closed UTC days, kept so that a report prices only what can still change.

A day's cost lines stop changing once nothing can be written about it any more:

- allocation rows: an allocation is created and released at the allocator's clock, so once a
  day is over no row can start or end inside it (``CLOSE_MARGIN_S`` covers a write decided
  just before midnight and committed just after, and clocks a little apart);
- prices: ``Accounting`` holds them for its life (``ClosedDays.bind`` drops everything when
  they, the utilization source or the idle threshold are replaced);
- utilization: measurements of a time may still change while late samples of it are accepted
  and rolled up (``UtilizationSource.settle_s``; for the telemetry roll-ups the raw retention
  plus one roll-up round). Until then a day is kept with the source's ``version`` of its
  measurements and priced again when that changes; once settled, it is checked a last time.

Lines are kept for every tenant (a tenant filter is applied when they are read back: every line
belongs to one tenant, so filtering lines equals filtering allocations) and per utilization
resolution (a report reads measurements at one resolution for its whole window). Summing the
days' exact ``Fraction``s gives what pricing the window at once gives: cost, hours and idle
spend are sums over seconds, and cutting a piece at midnight splits it into two exact parts.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from policies.errors import InvalidRequest
from policies.pricing import CostLine, Period

DAY_S = 86_400
HOUR_S = 3600
CLOSE_MARGIN_S = 600
"""How long after its end a day's allocation rows are taken as final (and its measurements,
after the utilization source's ``settle_s`` more)."""
DEFAULT_MAX_DAYS = 2048
"""Blocks (of one resolution each) kept: a few years of days, with a day's hours."""


def blocks(start: int, end: int, ended_until: int) -> list[Period]:
    """``[start, end)`` (epoch s) cut at UTC midnights, and the day holding ``ended_until``
    also at the last whole hour before it: what ended of that day can then be kept too."""
    cuts = [start]
    midnight = start - start % DAY_S + DAY_S
    while midnight < end:
        cuts.append(midnight)
        midnight += DAY_S
    cuts.append(end)
    hour = ended_until - ended_until % HOUR_S
    if start < hour < end and hour % DAY_S != 0 and hour not in cuts:
        cuts = sorted([*cuts, hour])
    return [Period(a, b) for a, b in itertools.pairwise(cuts)]


def can_keep(block: Period, ended_until: int) -> bool:
    """A block from a midnight to a whole hour, all of it ended: its lines can be kept."""
    return block.start % DAY_S == 0 and block.end % HOUR_S == 0 and block.end <= ended_until


@dataclass(frozen=True, slots=True)
class Kept:
    """A day's lines, and the utilization source's version of its measurements they were
    priced on (None: settled, nothing can change them)."""

    lines: tuple[CostLine, ...]
    version: object


class ClosedDays:
    """Cost lines of closed days (and of the ended hours of the day in progress, from its
    midnight), every tenant, by (block, resolution): a bounded LRU.

    Safe to share between threads: lookups and inserts hold a lock; pricing happens outside
    it (two threads missing the same day both price it, with the same result).
    """

    def __init__(self, max_days: int = DEFAULT_MAX_DAYS) -> None:
        if max_days < 1:
            raise InvalidRequest("closed days kept", max_days, "at least 1")
        self.max_days = max_days
        self._lines: OrderedDict[tuple[Period, int], Kept] = OrderedDict()
        self._basis: object = None
        self._lock = threading.Lock()

    def bind(self, basis: object) -> None:
        """Keep lines priced on ``basis`` (prices, source, threshold): a new one drops them."""
        with self._lock:
            if basis != self._basis:
                self._lines.clear()
                self._basis = basis

    def get(self, block: Period, resolution_s: int) -> Kept | None:
        with self._lock:
            found = self._lines.get((block, resolution_s))
            if found is not None:
                self._lines.move_to_end((block, resolution_s))
            return found

    def head(self, start: int, resolution_s: int) -> tuple[Period, Kept] | None:
        """The part of the day from midnight ``start`` kept at ``resolution_s``, if any."""
        with self._lock:
            for (b, r), kept in self._lines.items():
                if b.start == start and r == resolution_s and b.seconds != DAY_S:
                    return b, kept
            return None

    def put(
        self, block: Period, resolution_s: int, lines: Sequence[CostLine], version: object = None
    ) -> None:
        with self._lock:
            if block.seconds != DAY_S:
                # A longer part of the day in progress replaces the shorter ones kept before.
                for b, r in [k for k in self._lines if k[0].start == block.start]:
                    if r == resolution_s and b.end < block.end:
                        del self._lines[(b, r)]
            self._lines[(block, resolution_s)] = Kept(tuple(lines), version)
            self._lines.move_to_end((block, resolution_s))
            while len(self._lines) > self.max_days:
                self._lines.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._lines)
