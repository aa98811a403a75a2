"""Faults of the simulated fleet: crashes, spot preemptions and slow replicas, scheduled, Poisson or injected.

`crash` kills an engine (its in-flight requests fail with 500 and are retried if
they had not streamed; its cache is lost); `preempt` also takes the GPU slot for
good; `slow` multiplies a replica's step time for a while. Victims are ready
replicas drawn with the fleet's seeded fault generator; the pool's target is
unchanged, so reconcile starts replacements at once (fleet.py's docstring has the
full rules).

Must not: read the wall clock or use any generator but `_fault_rng` (one draw
sequence per seed keeps fault runs reproducible).
"""

from __future__ import annotations

from controller.sim.fleet_events import EV_FAULT, EV_SLOW_END
from controller.sim.fleet_records import READY, FleetBase, PoolRT


class FaultsMixin(FleetBase):
    """The faults of a Fleet (state: `_fault_rng`; the scenario's `faults` list is indexed by event payload)."""

    def _schedule_faults(self) -> None:
        """Scenario faults: one event at `at_s`, or the first draw of a Poisson process."""
        for k, f in enumerate(self.scenario.faults):
            if f.at_s is not None:
                self._push(f.at_s, EV_FAULT, k, 0)
            else:
                self._schedule_poisson(k)

    def _schedule_poisson(self, k: int) -> None:
        f = self.scenario.faults[k]
        p = self.pools[f.pool]
        n = max(1, sum(1 for i in p.insts if i.phase == READY))
        assert f.rate_per_hour is not None  # only Poisson faults are scheduled here
        rate_per_s = f.rate_per_hour / 3600.0 * n
        self.push(self.now_s + float(self._fault_rng.exponential(1.0 / rate_per_s)), EV_FAULT, k, 0)

    def _on_fault_event(self, k: int) -> None:
        f = self.scenario.faults[k]
        self._fault(f.kind, self.pools[f.pool], f.count if f.at_s is not None else 1, f.duration_s, f.factor)
        if f.rate_per_hour is not None:
            self._schedule_poisson(k)

    def _fault(self, kind: str, p: PoolRT, count: int, duration_s: float, factor: float) -> list[str]:
        ready = [i for i in p.insts if i.phase == READY]
        if not ready:
            return []
        pick = self._fault_rng.choice(len(ready), size=min(count, len(ready)), replace=False)
        hit = [ready[j] for j in sorted(int(x) for x in pick)]
        now = self.now_s
        for inst in hit:
            eng = inst.live_engine()
            if kind == "slow":
                inst.slow_version += 1
                eng.set_slow(factor, now)
                self.push(now + duration_s, EV_SLOW_END, inst, inst.slow_version)
                continue
            reqs = eng.crash()
            self._retire(inst, "preempt" if kind == "preempt" else "crash")
            for r in reqs:
                if r.idx < 0:
                    continue  # a request from outside the workload (the live HTTP API): its handler fails it
                self._count_error(r, "500")
                if r.streamed:
                    self._fail(r)
                else:
                    self._retry_or_fail(r)
        if kind != "slow":
            self._reconcile(p)
        return [i.rid for i in hit]
