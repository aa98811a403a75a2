"""A small closed-loop fleet on loopback, for the fault tests: real HTTP /metrics and discovery, real gRPC control.

The plant: each pool serves a seeded Poisson arrival stream with `replicas` vLLM replicas, the number
the autoscaler fake (tests/fakes/act_fleet.py) was last told. Per replica, utilisation is
ρ = λ / (N × capacity); the p95 TTFT grows as base / (1 − ρ) (an M/M/1-like queue, capped at ρ = 0.95),
running = λ × service time / N and the queue builds past capacity. Counters are cumulative per
replica and rendered in vLLM's format (tests/telemetry/canned.py), so the scrape source reads them
exactly as it reads a real engine. Time moves only in `advance(dt)` (the tests' virtual clock).

Faults are set per pool (or for discovery) and are served on the wire, as the fleet would show them:

- refused: the connection is closed without an answer (a crashed exporter behind a proxy);
- error: HTTP 500; hang: no answer until the test releases it (bounded by HANG_LIMIT_S);
- slow: the answer comes `slow_s` late (beyond the tick's read deadline);
- partial: the waiting and TTFT series are missing; nan: running is NaN and KV usage +Inf;
- reset: every counter restarts from zero (an engine restart); skew: samples carry timestamps an
  hour off (the scrape path ignores them: freshness is when a page was read);
- vanish: the pool's targets disappear from discovery while its replicas still run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from controller.clock import VirtualClock
from controller.config import Settings
from controller.runtime.main import build_services
from tests.fakes.act_fleet import FakeFleetServer
from tests.telemetry.canned import VllmState, vllm_text

HANG_LIMIT_S = 20.0  # a hung handler gives up after this even if nobody releases it
CAPACITY_RPS = 4.0  # requests per second one replica serves at ρ = 1 (a small model on one GPU)
SERVICE_S = 2.0  # mean time a request runs (prefill + ~200 output tokens at ~10 ms each)
BASE_TTFT_S = 0.2  # p95 TTFT of an idle replica
FAULTS = ("refused", "error", "hang", "slow", "partial", "nan", "reset", "skew", "vanish")


@dataclass
class _Replica:
    state: VllmState = field(default_factory=VllmState)


@dataclass
class _Pool:
    name: str
    replicas: int
    rps: float
    members: list[_Replica] = field(default_factory=list)


class FaultFleet:
    """Pools of replicas behind one loopback HTTP server (/sd, /m/POOL/I) and a FakeFleetServer for control."""

    def __init__(self, pools: Mapping[str, tuple[int, float]], *, seed: int = 0) -> None:
        """`pools`: name → (replicas at start, mean arrival rate in requests/s)."""
        self.rng = np.random.default_rng(seed)
        self.pools = {n: _Pool(n, r, rps) for n, (r, rps) in pools.items()}
        for p in self.pools.values():
            p.members = [_Replica() for _ in range(p.replicas)]
        self.faults: dict[str, str] = {}  # pool (or "sd") → fault
        self.slow_s = 5.0
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.hits = 0
        self.control = FakeFleetServer(set(pools))
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                # the daemon gives up on an answer at its read deadline: a broken pipe is expected under a fault
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._answer()

            def _answer(self) -> None:
                fleet.hits += 1
                parts = self.path.strip("/").split("/")
                key = "sd" if parts == ["sd"] else (parts[1] if len(parts) == 3 and parts[0] == "m" else "")
                fault = fleet.faults.get(key, "")
                if fault == "refused":  # no status line: the client sees the connection closed
                    self.close_connection = True
                    return
                if fault == "hang":
                    fleet.release.wait(HANG_LIMIT_S)
                    return
                if fault == "slow":
                    fleet.release.wait(fleet.slow_s)
                if fault == "error":
                    self.send_error(500, "injected")
                    return
                body = fleet._sd() if key == "sd" else fleet._page(parts[1], int(parts[2])) if key else None
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json" if key == "sd" else "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> FaultFleet:
        self._thread.start()
        self.control.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.control.__exit__()
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def discovery_url(self) -> str:
        return f"http://{self.address}/sd"

    # ------------------------------------------------------------------ the plant

    def set_fault(self, where: str, fault: str | None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {FAULTS}")
        with self.lock:
            if fault is None:
                self.faults.pop(where, None)
            else:
                self.faults[where] = fault
            if fault == "reset":
                for r in self.pools[where].members:
                    r.state = VllmState()
        if fault not in ("hang", "slow"):
            self.release.set()
            self.release = threading.Event()

    def commanded(self) -> dict[str, int]:
        """Replicas per pool as the autoscaler was last told (the start-up count before any plan)."""
        with self.control.autoscaler.gate.lock:
            plan = {p.pool: p.replicas for p in self.control.autoscaler.plan.pools}
        return {n: plan.get(n, p.replicas) for n, p in self.pools.items()}

    def advance(self, dt_s: float) -> None:
        """Move the plant `dt_s` seconds: the commanded replicas run, arrivals are served, counters grow."""
        target = self.commanded()
        with self.lock:
            for name, p in self.pools.items():
                n = max(0, target[name])
                while len(p.members) < n:
                    p.members.append(_Replica())
                del p.members[n:]
                p.replicas = n
                if n == 0:
                    continue
                arrivals = float(self.rng.poisson(p.rps * dt_s))
                rho = min(0.95, p.rps / (n * CAPACITY_RPS))
                ttft = BASE_TTFT_S / (1.0 - rho)
                bucket = next(b for b in VllmState().ttft.bounds if b >= ttft)
                for r in p.members:
                    s = r.state
                    share = arrivals / n
                    s.running = p.rps * SERVICE_S / n
                    s.waiting = max(0.0, (p.rps / n - CAPACITY_RPS) * SERVICE_S)
                    s.kv_usage = min(1.0, rho)
                    s.prompt_tokens += 500 * share
                    s.generation_tokens += 200 * share
                    s.ttft.add(bucket, share)
                    s.itl.add(0.025, 200 * share)

    def _sd(self) -> str:
        with self.lock:
            groups = [{"targets": [f"{self.address}"], "labels": {"pool": p.name, "kind": "vllm",
                                                                  "__metrics_path__": f"/m/{p.name}/{i}"}}
                      for p in self.pools.values() if self.faults.get(p.name) != "vanish"
                      for i in range(len(p.members))]
        return json.dumps(groups)

    def _page(self, pool: str, i: int) -> str | None:
        with self.lock:
            p = self.pools.get(pool)
            if p is None or i >= len(p.members):
                return None
            s = p.members[i].state
            fault = self.faults.get(pool, "")
            if fault == "nan":
                s = VllmState(**{**s.__dict__, "running": math.nan, "kv_usage": math.inf})
            if fault == "skew":
                s = VllmState(**{**s.__dict__, "timestamp_ms": 1_000 * 3_600})  # 1970: an hour after the epoch
            text = vllm_text(s, engine=str(i))
        if fault == "partial":
            text = "\n".join(line for line in text.splitlines()
                             if "num_requests_waiting" not in line and "time_to_first_token" not in line) + "\n"
        return text


# --------------------------------------------------------------------------- a daemon governing it


def fault_settings(fleet: FaultFleet, state_dir, *, tick_s: float = 15.0, scrape_timeout_s: float = 0.2,
                   guards: Mapping | None = None, policy: str = "slo-feedback", policy_params: Mapping | None = None,
                   pools_only: tuple[str, ...] | None = None, act: tuple[float, int, float] = (0.5, 1, 0.1),
                   **over) -> Settings:
    """A config for a daemon on `fleet`: direct scrape via its discovery, gRPC control (`act`: timeout, retries,
    backoff of both targets), no stabilisation
    (so a scale-down the data asks for happens at once: what stops one under a fault is the guard)."""
    pools = [{"name": n, "model": "llama-3-8b", "sku": "h100", "usd_per_gpu_hour": 2.0, "min_replicas": 1,
              "max_replicas": 12} for n in fleet.pools if pools_only is None or n in pools_only]
    return Settings(**{
        "mode": "active", "policy": policy, "tick_interval_s": tick_s, "state_dir": str(state_dir),
        "policy_params": dict(policy_params if policy_params is not None else
                              {"scale_down_stabilization_s": 0, "ttft_settle_s": 0}),
        "telemetry": {"source": "scrape", "scrape": {"discovery_url": fleet.discovery_url,
                                                     "timeout_s": scrape_timeout_s},
                      "window_s": 4 * tick_s, "stale_after_s": 2 * tick_s},
        "pools": pools,
        "actuators": {"router": {"address": fleet.control.address, "timeout_s": act[0], "retries": act[1],
                                 "backoff_s": act[2]},
                      "autoscaler": {"address": fleet.control.address, "timeout_s": act[0], "retries": act[1],
                                     "backoff_s": act[2]},
                      "decision_validity_s": 4 * tick_s},
        "api": {"listen": "127.0.0.1:0"}, "metrics": {"listen": None}, "log": {"format": "text"},
        "guards": dict(guards if guards is not None else {"max_step_up": 4, "max_step_down": 2,
                                                           "scale_down_stabilization_s": 0}),
        **over})


class Governed:
    """A daemon (build_services, as `governor run` builds it) on a FaultFleet, ticked on a virtual clock."""

    def __init__(self, fleet: FaultFleet, state_dir, *, start_s: float = 1_800_000_000.0, **settings) -> None:
        self.fleet = fleet
        self.clock = VirtualClock(start_s)
        self.settings = fault_settings(fleet, state_dir, **settings)
        self.services = build_services(self.settings, clock=self.clock, logger=logging.getLogger("test.faults"))
        self.daemon = self.services.daemon
        self.reports: list = []

    def tick(self):
        """One tick, then the plant and the clock move one period."""
        rep = self.daemon.tick()
        self.reports.append(rep)
        dt = self.settings.tick_interval_s
        self.fleet.advance(dt)
        self.clock.advance(dt)
        return rep

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        return self.services.metrics.registry.get_sample_value(name, dict(labels or {}))

    def close(self) -> None:
        self.services.close()

    def __enter__(self) -> Governed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
