"""How long each phase of a tick may take, from the configured timeouts, and whether it fits the tick.

A tick reads (telemetry and the autoscaler's fleet state, at the same time), plans, then
actuates (router and autoscaler at the same time). Each phase is cut off by its own deadline
inside the tick, so a fleet that hangs instead of refusing costs at most these budgets, never a
skipped tick (issue 21: 5 s of reading plus 8.4 s of sequential retries against a 3 s period):

- read, direct scrape: one round deadline of `2 × timeout_s + 0.5 s` covers the discovery fetch
  and every target (urllib's timeout bounds each socket operation, not the whole request, so
  a target trickling bytes gets a second timeout's worth, plus half a second for parsing);
- read, Prometheus: `telemetry.prometheus.timeout_s` for every query of the read together;
- read, fleet state: one `GetFleetState` call of the autoscaler's `timeout_s`, beside the above;
- actuate: per target `(retries + 1) × timeout_s` of calls plus the backoff waits
  `backoff_s × (2^retries − 1)`, the two targets side by side (the longer counts).

`tick_budget_problems(settings)` is what `governor config validate` and `governor run` refuse
(controller/runtime/preflight.py): read + actuate must fit `PLAN_SHARE` of the tick period, naming the
fields to change. Pure arithmetic on the config: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.config.settings import Settings

# Part of the tick period the read and actuate phases may use together; the rest is left to the
# plan (the MPC bounds its own search by wall time), the learning step and the state-store writes,
# which on the shipped configs take a few milliseconds to ~100 ms (docs/OPERATING.md, `durations_ms`).
PLAN_SHARE = 0.9
# Added to the scrape round for parsing the pages after the last byte arrives: a vLLM page parses in
# ~1 ms, so half a second covers dozens of targets on a loaded host.
SCRAPE_PARSE_SLACK_S = 0.5


def scrape_round_s(timeout_s: float) -> float:
    """The scrape source's deadline for one whole read (discovery and every target)."""
    return 2.0 * timeout_s + SCRAPE_PARSE_SLACK_S


def send_budget_s(timeout_s: float, retries: int, backoff_s: float) -> float:
    """The longest one target's command can take: every attempt timing out, with the backoff waits
    between them (backoff before re-send k is backoff_s × 2^(k−1))."""
    return (retries + 1) * timeout_s + backoff_s * (2 ** retries - 1)


@dataclass(frozen=True, slots=True)
class TickBudget:
    read_s: float  # telemetry read and fleet-state call, side by side
    actuate_s: float  # router and autoscaler commands, side by side
    period_s: float

    @property
    def allowed_s(self) -> float:
        return PLAN_SHARE * self.period_s

    @property
    def fits(self) -> bool:
        return self.read_s + self.actuate_s <= self.allowed_s + 1e-9


def tick_budget(settings: Settings) -> tuple[TickBudget, list[tuple[str, float]], list[tuple[str, float]]]:
    """(the budget, the read terms, the actuate terms): each term names the config fields behind it."""
    tel = settings.telemetry
    read: list[tuple[str, float]] = []
    if tel.source == "scrape":
        read.append(("telemetry.scrape.timeout_s (2 × timeout_s + 0.5 s)", scrape_round_s(tel.scrape.timeout_s)))
    else:
        read.append(("telemetry.prometheus.timeout_s", tel.prometheus.timeout_s))
    acts = settings.actuators
    actuate: list[tuple[str, float]] = []
    if not acts.kubernetes.enabled and acts.autoscaler.address:
        read.append(("actuators.autoscaler.timeout_s (GetFleetState)", acts.autoscaler.timeout_s))
    # One gRPC actuator serves both targets with the larger of their timeouts, retries and backoffs
    # (controller/runtime/actuators.py); beside the Kubernetes adapter only the router is gRPC.
    sent = [a for w, a in (("router", acts.router), ("autoscaler", acts.autoscaler))
            if a.address and (w == "router" or not acts.kubernetes.enabled)]
    if sent:
        timeout, retries, backoff = (max(a.timeout_s for a in sent), max(a.retries for a in sent),
                                     max(a.backoff_s for a in sent))
        actuate.append(("actuators.{router,autoscaler}.timeout_s × (retries + 1) + backoff_s × (2^retries − 1)",
                        send_budget_s(timeout, retries, backoff)))
    budget = TickBudget(read_s=max((s for _, s in read), default=0.0),
                        actuate_s=max((s for _, s in actuate), default=0.0), period_s=settings.tick_interval_s)
    return budget, read, actuate


def tick_budget_problems(settings: Settings) -> list[str]:
    """One line naming the fields when the worst-case read + actuate cannot fit the tick; [] when it fits."""
    budget, read, actuate = tick_budget(settings)
    if budget.fits:
        return []
    terms = [f"{name} = {s:g} s" for name, s in read + actuate]
    return [f"tick_interval_s: {settings.tick_interval_s:g} s cannot hold a tick whose phases may take "
            f"{budget.read_s:g} s to read + {budget.actuate_s:g} s to actuate = {budget.read_s + budget.actuate_s:g} s "
            f"(at most {PLAN_SHARE:.0%} of the tick, {budget.allowed_s:g} s, leaving the rest to plan): "
            f"{'; '.join(terms)}. Lower those timeouts or retries, or raise tick_interval_s"]


__all__ = ["PLAN_SHARE", "TickBudget", "scrape_round_s", "send_budget_s", "tick_budget", "tick_budget_problems"]
