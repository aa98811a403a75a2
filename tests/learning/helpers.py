"""Small synthetic histories for the learning tests: observations made from the prior itself,
distorted by a known factor (what a model has to learn), with seeded noise. No simulator."""

from __future__ import annotations

import numpy as np

from controller.core.coupling import (
    TOKEN_GRID,
    CacheInputs,
    Calibration,
    LatencyInputs,
    PhysicsTable,
    PoolPhysics,
    cache_prior,
    latency_prior,
)
from controller.core.observations import ObservationRecord, PoolSettings, ReuseProfile
from controller.types import ClassObservation, FleetObservation, PoolObservation, Reading

PROFILE = ReuseProfile((0.05, 0.10, 0.14, 0.18, 0.22, 0.28, 0.32, 0.35, 0.36, 0.37))


def toy_physics(key: str = "toy/gpu/tp1") -> PoolPhysics:
    n = TOKEN_GRID
    return PoolPhysics(key=key, decode_step_s=tuple(0.010 + 0.00035 * n),
                       prefill_step_s=tuple(0.025 + 0.00007 * np.maximum(n - 64, 0)), decode_ctx_s_per_token=9e-8,
                       prefill_attn_s_per_work=3.4e-9, kv_capacity_tokens=450_000, mixed_seq_s=3e-4)


def synthetic_records(n_ticks: int, *, seed: int = 0, time_scale: float = 1.3, wait_scale: float = 0.6,
                      pools: tuple[str, ...] = ("p0", "p1"), t0_s: float = 0.0, tick_s: float = 15.0,
                      segment_ticks: int = 12) -> list[ObservationRecord]:
    """Records from a 'true' fleet that is the prior with other physics (steps `time_scale` slower,
    queueing `wait_scale` of the M/G/1 wait) and a hit-rate-dependent TTFT distortion, with 3 %
    noise; settings change every `segment_ticks` ticks (replicas 2/4/6, prefix weight 0/3/8) under
    an hourly load wave."""
    rng = np.random.default_rng(seed)
    table = PhysicsTable([toy_physics()])
    truth = PhysicsTable([toy_physics()], {toy_physics().key: Calibration(time_scale, wait_scale)})
    out = []
    settings = {p: PoolSettings(replicas=4) for p in pools}
    for i in range(n_ticks):
        t = t0_s + (i + 1) * tick_s
        if i % segment_ticks == 0:
            settings = {p: PoolSettings(replicas=int(rng.choice([2, 4, 6])),
                                        prefix_weight=float(rng.choice([0.0, 3.0, 8.0]))) for p in pools}
        obs_pools = {}
        for j, p in enumerate(pools):
            st = settings[p]
            R = st.replicas
            lam = (6.0 + 3.0 * np.sin(2 * np.pi * t / 3600.0 + j)) * rng.uniform(0.95, 1.05)
            prompt, output = 1200.0 * rng.uniform(0.9, 1.1), 200.0 * rng.uniform(0.9, 1.1)
            c = CacheInputs.build(1, physics_index=0, replicas=R, arrival_rps=lam, prompt_tokens=prompt,
                                  output_tokens=output,
                                  reuse_hit_at=np.array(PROFILE.hit_at), prefix_weight=st.prefix_weight)
            hit = float(np.clip(cache_prior(table, c).hit_rate[0] * 1.2, 0, 1))
            x = LatencyInputs.build(1, physics_index=0, arrival_rps_per_replica=lam / R, prompt_tokens=prompt,
                                    output_tokens=output, hit_rate=hit)
            pr = latency_prior(truth, x)

            def noisy(v: float, f: float = 1.0) -> Reading:
                return Reading(float(v * f * np.exp(rng.normal(0, 0.03))))

            obs_pools[p] = PoolObservation(
                pool=p, replicas_ready=Reading(float(R)), replicas_starting=Reading(0.0),
                replicas_draining=Reading(0.0),
                arrival_rps=Reading(lam), running=Reading(float(pr.batch[0] * R)), waiting=Reading(0.0),
                kv_usage_frac=Reading(0.3), hit_rate=Reading(hit + rng.normal(0, 0.005)),
                ttft_p50_s=noisy(pr.ttft_p50_s[0], 1.0 + 0.5 * hit),
                ttft_p95_s=noisy(pr.ttft_p95_s[0], 1.0 + 0.5 * hit),
                tpot_p50_s=noisy(pr.tpot_p50_s[0]), tpot_p95_s=noisy(pr.tpot_p95_s[0]),
                prompt_tokens_rps=Reading(lam * prompt), generation_tokens_rps=Reading(lam * output),
                gpu_util_frac=Reading(float(pr.gpu_busy_frac[0])))
        total = sum(o.arrival_rps.value for o in obs_pools.values())
        classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(total * s))
                   for c, s in (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))}
        obs = FleetObservation(at_s=t, pools=obs_pools, classes=classes, source="synthetic")
        out.append(ObservationRecord(at_s=t, observation=obs, settings=dict(settings),
                                     reuse=dict.fromkeys(pools, PROFILE)))
    return out


def physics_by_pool(pools: tuple[str, ...] = ("p0", "p1")) -> dict[str, PoolPhysics]:
    return {p: toy_physics() for p in pools}
