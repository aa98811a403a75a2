"""What a controller knows about a simulated fleet: its FleetSpec, from the scenario.

The bench and the demo hand this to the controller, exactly as an operator
would describe a real fleet in the daemon's config (pools, prices, bounds,
start-up delays, SLOs).
"""

from __future__ import annotations

from controller.sim.scenario import Scenario
from controller.types import FleetSpec, PoolSpec, SloSpec


def fleet_spec_from_scenario(scenario: Scenario) -> FleetSpec:
    pools = []
    catalogue = scenario.engine_catalogue()
    for p in scenario.pools:
        price = p.usd_per_gpu_hour if p.usd_per_gpu_hour is not None else catalogue.sku(p.sku).usd_per_gpu_hour
        pools.append(PoolSpec(
            name=p.name, model=catalogue.model(p.model).name, sku=catalogue.sku(p.sku).name,
            engine=p.engine.exposition,
            gpus_per_replica=p.tp,
            usd_per_replica_hour=price * p.tp, min_replicas=p.min_replicas, max_replicas=p.max_replicas,
            startup_warm_s=p.startup_warm_s, startup_cold_s=p.startup_cold_s, role=p.role, group=p.group,
            max_num_seqs=p.engine.max_num_seqs, max_num_batched_tokens=p.engine.max_num_batched_tokens,
            eligible=tuple(sorted((c, v) for c, v in p.eligible.items() if v < 1.0)),
        ))
    slos = {name: SloSpec(ttft_s=c.ttft_slo_s, tpot_s=c.tpot_slo_s) for name, c in scenario.classes.items()}
    return FleetSpec(pools=tuple(pools), slos=slos)
