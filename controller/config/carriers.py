"""Which configured actuator carries which lever, and so which lever groups the MPC plans.

`actuator_carriers` names each actuator the config turns on (actuators.* in deploy/governor.example.yaml)
with the components it is in the lever table (controller/levers.py, `Carrier`):

- `actuators.router.address`: a RouterControl target (`governor picker`, or the simulator's control plane,
  which carries the same planned levers) → picker: every router lever;
- `actuators.autoscaler.address` (without the Kubernetes adapter, which replaces it) → a gRPC Autoscaler:
  replicas, warm standby, engine batch caps;
- `actuators.keda.enabled` → KEDA: replica targets only;
- `actuators.kubernetes.enabled` → the Kubernetes adapter: replicas, warm standby, engine batch caps;
- each of `actuators.kubernetes.routers` → vllm-router / sglang-router: membership only, none of the levers.

`carriage` says, lever by lever, whether the MPC plans it and who carries it (`governor config validate`
prints it; the daemon holds the groups nobody carries, controller/runtime/main.py).

Must not: read files or open anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.settings import Settings
from controller.levers import LEVERS, Carrier, Lever, held_groups


def actuator_carriers(settings: Settings) -> dict[str, frozenset[Carrier]]:
    """Each configured actuator (a label for people, e.g. "router 127.0.0.1:50061") → the carriers it is."""
    acts = settings.actuators
    out: dict[str, frozenset[Carrier]] = {}
    if acts.router.address:
        out[f"router {acts.router.address}"] = frozenset({Carrier.PICKER})
    if acts.autoscaler.address and not acts.kubernetes.enabled:
        out[f"autoscaler {acts.autoscaler.address}"] = frozenset({Carrier.AUTOSCALER})
    if acts.keda.enabled:
        out[f"keda {acts.keda.listen}"] = frozenset({Carrier.KEDA})
    if acts.kubernetes.enabled:
        out["kubernetes"] = frozenset({Carrier.KUBERNETES})
        for r in acts.kubernetes.routers:
            out[f"{r.kind} {r.url}"] = frozenset({Carrier(r.kind)})
    return out


def carriers_of(settings: Settings) -> frozenset[Carrier]:
    return frozenset().union(*actuator_carriers(settings).values())


def held_levers(settings: Settings) -> tuple[str, ...]:
    """The `MpcConfig.fixed_levers` groups that no configured actuator carries (none without any actuator)."""
    return held_groups(carriers_of(settings))


@dataclass(frozen=True, slots=True)
class Carriage:
    lever: Lever
    planned: str  # "yes", "no: held at default" (nobody carries it), "not by the MPC" (it never plans it)
    carried_by: tuple[str, ...]  # the actuators' labels


def carriage(settings: Settings) -> list[Carriage]:
    """Lever by lever, in table order: planned or not, and by which configured actuators it is carried."""
    acts = actuator_carriers(settings)
    held = set(held_groups(carriers_of(settings)))
    out = []
    for lv in LEVERS:
        by = tuple(name for name, cs in acts.items() if cs & lv.carriers)
        if lv.plan is not None:
            planned = "no: held at default" if lv.plan in held else "yes"
        else:
            planned = "yes" if lv.array is not None else "not by the MPC"  # replicas: always planned
        out.append(Carriage(lv, planned, by))
    return out


def carriage_table(settings: Settings) -> str:
    """`carriage` as text: one line per lever."""
    rows = [("lever", "planned", "carried by")]
    for c in carriage(settings):
        who = ", ".join(c.carried_by) if c.carried_by else (
            "nobody: held at default" if c.planned.startswith("no") else "nobody")
        rows.append((c.lever.name, c.planned.split(":")[0], who))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    if not actuator_carriers(settings):
        rows.append(("(no actuator configured: decisions are only recorded, every lever is planned)", "", ""))
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows)
