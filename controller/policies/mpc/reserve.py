"""What a tick keeps of its time budget for the work after the planner's search, measured tick by tick.

With a timer, the planner's search stops a *reserve* before the end of the tick's budget: after it
come the chosen plan scored in detail, its terms, the decisions, reasons and diagnostics. That work
grows with the pools (about 2 ms of a 10-pool tick, 5 ms at 40 pools, 12-15 ms at 100, CPU time on the
bench's machine) and differs by machine and by how loaded it is, so no constant fits it. Each tick the
policy records its *spill*, the time the tick ran past the point where the search had to stop (what
followed the search, plus how far the search's last batch ran over its deadline, if it did), and the
next tick's reserve is an upper bound on the next spill from the recent ones:

    reserve = mean + sqrt(q / (1 − q)) × standard deviation,   q = 0.99

Cantelli's one-sided inequality, P(X − μ ≥ λ) ≤ σ² / (σ² + λ²), holds for any distribution with that
mean and variance: a spill beyond this bound has probability at most 1 − q = 1 %, the p99 the budget
is held to (about μ + 9.95 σ; with spills of 12 ± 3 ms, 42 ms). It is loose (a normal distribution's
p99 is μ + 2.33 σ) because the spills are not normal: a collector pass or a neighbour on the core puts
a few far out, and a bound that needs no shape costs the search a few per cent of its time at most. A
slow spell widens σ, and the reserve grows with it for as long as the spell is in the window.

The window is the last `WINDOW` spills of a fleet of this size (the work grows with the pools: a fleet
whose pool count changes starts over). Until `MIN_SPILLS` are in, the reserve is at least the first
tick's (`first_reserve_s`: `time_reserve_s` if set, else a tenth of the budget). It is at most half the
budget: what follows the search is then most of the tick, the budget is too small for the fleet, and
the search keeps half of it (`capped` says so in the diagnostics). An operator's `time_reserve_s`
fixes the reserve and nothing is measured.

Must not: read a clock (the readings come from the policy's injected timer, through `PlanResult`) or do I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.core.mpc import MpcConfig, PlanResult, first_reserve_s

# The bound's probability: a spill beyond the reserve at most once in a hundred ticks (the p99 target).
COVER = 0.99
CANTELLI_K = math.sqrt(COVER / (1.0 - COVER))
# Spills kept: the standard deviation of n samples has a relative standard error of about 1/sqrt(2(n-1)),
# 13 % at 30; at a 15 s tick, 30 ticks are 7.5 minutes, so a change of machine load is followed within that.
WINDOW = 30
# Below this many the standard deviation is too uncertain to bound a tail with (relative error > 35 %).
MIN_SPILLS = 5
# The search keeps at least this share of the budget, whatever follows it.
MAX_RESERVE_FRAC = 0.5


@dataclass(frozen=True)
class Spills:
    """The recent spills (seconds of the budget's timer) of ticks on a fleet of `pools` pools, oldest first."""

    pools: int
    seconds: tuple[float, ...] = ()

    def add(self, pools: int, spill_s: float) -> Spills:
        """These spills with one more (a fleet of another size starts over)."""
        kept = self.seconds if pools == self.pools else ()
        return Spills(pools, (*kept, float(spill_s))[-WINDOW:])


@dataclass(frozen=True)
class Reserve:
    seconds: float
    basis: str  # "measured" | "first" (too few spills: the first tick's bound) | "fixed" (time_reserve_s)
    spills: int  # spills the bound was taken over
    capped: bool  # the bound was above half the budget


def reserve(spills: Spills | None, pools: int, cfg: MpcConfig) -> Reserve:
    """The reserve for this tick (module docstring). Example: spills 15, 16, 17, 16, 16 ms → mean 16,
    σ 0.71 → 23.0 ms; one of them 60 ms → mean 24.8, σ 19.7 → 220 ms."""
    cap = MAX_RESERVE_FRAC * cfg.time_budget_s
    if cfg.time_reserve_s is not None:
        return Reserve(float(cfg.time_reserve_s), "fixed", 0, False)
    xs = spills.seconds if spills is not None and spills.pools == pools else ()
    bound = 0.0
    if len(xs) >= 2:
        mean = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        bound = mean + CANTELLI_K * sd
    basis = "measured"
    if len(xs) < MIN_SPILLS:
        first = first_reserve_s(cfg)
        if first > bound:
            bound, basis = first, "first"
    return Reserve(min(bound, cap), basis, len(xs), bound > cap)


def spill_s(result: PlanResult, end_s: float) -> float | None:
    """How far past the search's deadline the tick ran: what followed the search (to `end_s`, a reading
    of the same timer), plus the search's own overrun of its deadline; None without a timer."""
    if result.search_ended_s is None or result.search_deadline_s is None:
        return None
    return max(result.search_ended_s - result.search_deadline_s, 0.0) + max(end_s - result.search_ended_s, 0.0)


def timing(result: PlanResult, started_s: float, end_s: float, spill: float, kept: Reserve) -> dict[str, object]:
    """The tick's timing for the diagnostics (ms of the budget's timer): the whole tick, the search (from
    the tick's start to its end, the problem's building included), what followed it, the search's
    overrun of its deadline (below 0: it stopped early), the spill and the reserve it was given."""
    assert result.search_ended_s is not None and result.search_deadline_s is not None
    return {"tick_ms": round(1e3 * (end_s - started_s), 3),
            "search_ms": round(1e3 * (result.search_ended_s - started_s), 3),
            "after_search_ms": round(1e3 * (end_s - result.search_ended_s), 3),
            "search_over_deadline_ms": round(1e3 * (result.search_ended_s - result.search_deadline_s), 3),
            "spill_ms": round(1e3 * spill, 3),
            "reserve_ms": round(1e3 * kept.seconds, 3), "reserve_basis": kept.basis,
            "reserve_spills": kept.spills, "reserve_capped": kept.capped}
