"""Record (or check) SimObserver's observations on a seeded simulated run, for tests/sim/test_observe.py.

Each record is what a policy sees: the telemetry with the fleet's replica phases merged in
(core/estimate.py), as `Controller.step` does.

`record(...)` turns each FleetObservation into plain JSON with exact floats (float.hex), so a golden file
written by one version of the observer/window code and read by another shows any change, to the last bit.
The golden also holds a fingerprint of the fleet's own stats over the run: when the simulator or the
demo scenario changes, the fleet shows other numbers, the golden no longer applies and the test says so
(skips); the fast-vs-reference comparison still runs. Regenerate the golden (after checking that the
fast and reference paths agree):

    .venv/bin/python -m tests.sim.observe_golden
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from controller.bench.observe import SimObserver
from controller.core.estimate import estimate
from controller.sim.fleet import Fleet
from controller.sim.scenario import load_scenario
from controller.types import ClassObservation, FleetObservation, PoolObservation, Reading

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden") / "observe_demo_seed3.json"
SCENARIO = ROOT / "scenarios" / "demo.yaml"
SEED = 3
TICK_S = 5.0
TICKS = 60  # the whole 300 s: the surge at 20 s and the crash at 60 s


def _num(x: float | None) -> str | None:
    if x is None:
        return None
    return "nan" if math.isnan(x) else float(x).hex()


def _reading(r: Reading) -> list:
    return [_num(r.value), r.status.name, _num(r.age_s)]


def record(obs: FleetObservation) -> dict:
    out: dict = {"at_s": _num(obs.at_s), "source": obs.source, "errors": list(obs.errors), "pools": {}, "classes": {}}
    for key, po in sorted(obs.pools.items()):
        out["pools"][key] = _readings(po)
    for key, co in sorted(obs.classes.items()):
        out["classes"][key] = _readings(co)
    return out


def _readings(o: PoolObservation | ClassObservation) -> dict:
    return {f: _reading(getattr(o, f)) for f in o.__dataclass_fields__ if isinstance(getattr(o, f), Reading)}


def _fingerprint(fleet: Fleet, digest) -> None:
    """Feed what the fleet exposes (not what the observer makes of it) into `digest`."""
    for rs in sorted(fleet.replica_stats(), key=lambda r: r.replica_id):
        digest.update(repr((rs.replica_id, rs.pool, rs.num_requests_running, rs.num_requests_waiting,
                            rs.kv_cache_usage_perc, rs.prompt_tokens, rs.generation_tokens, rs.prefix_cache_hits,
                            rs.ttft_s.counts, rs.itl_s.counts)).encode())
    for key, cell in sorted(fleet.router_stats.cells.items()):
        digest.update(repr((key, cell.arrivals, cell.shed, cell.admitted, cell.ttft_s.counts)).encode())


def run_with_fingerprint(*, fast: bool = True, include_gpu: bool = True,
                         ticks: int = TICKS) -> tuple[str, list[dict]]:
    """(fingerprint of the simulated fleet's own stats over the run, one record per tick)."""
    fleet = Fleet(load_scenario(SCENARIO), seed=SEED)
    kwargs = {} if fast else {"fast": False}
    obs = SimObserver(fleet, include_gpu=include_gpu, **kwargs)
    digest = hashlib.sha256()
    out = []
    for k in range(1, ticks + 1):
        fleet.run_until(k * TICK_S)
        _fingerprint(fleet, digest)
        t = k * TICK_S
        out.append(record(estimate(None, obs.read(t), obs.fleet_state(), t).observation))
    return digest.hexdigest(), out


def run(*, fast: bool = True, include_gpu: bool = True, ticks: int = TICKS) -> list[dict]:
    return run_with_fingerprint(fast=fast, include_gpu=include_gpu, ticks=ticks)[1]


if __name__ == "__main__":
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    fingerprint, ticks = run_with_fingerprint()
    GOLDEN.write_text(json.dumps({"fleet_fingerprint": fingerprint, "ticks": ticks}, indent=None,
                                 separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}")
