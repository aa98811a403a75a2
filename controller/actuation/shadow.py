"""Shadow (dry-run) actuation: record exactly what would have been sent, send nothing.

The records are the same RoutingPolicy and ScalingPlan messages GrpcActuator would
send (built by the same functions), converted to dicts, so a shadow run shows the
real commands. This module must not open a socket.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from google.protobuf.json_format import MessageToDict

from controller.actuation.grpc_actuator import AUTOSCALER, ROUTER, routing_policy_for, scaling_plan_for
from controller.actuation.outcome import SHADOW, ActuationOutcome, FleetStateView, TargetHealth, TargetResult
from controller.clock import Clock
from controller.types import Decision


def message_dict(msg) -> dict[str, Any]:
    """A proto message as a dict with the .proto field names, default values included."""
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


class ShadowActuator:
    """Keeps the last `keep` records (oldest dropped), so a long shadow run has bounded memory."""

    def __init__(self, *, clock: Clock | None = None, issuer: str = "governor", keep: int = 1000) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (got {keep})")
        self._clock = clock
        self._issuer = issuer
        self._records: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def apply(self, decision: Decision) -> ActuationOutcome:
        record = {
            "decision_id": decision.decision_id,
            "generation": decision.generation,
            "at_s": self._clock.now_s() if self._clock is not None else decision.at_s,
            ROUTER: message_dict(routing_policy_for(decision, self._issuer)),
            AUTOSCALER: message_dict(scaling_plan_for(decision, self._issuer)),
        }
        with self._lock:
            self._records.append(record)
        return ActuationOutcome(
            decision_id=decision.decision_id, generation=decision.generation, status=SHADOW,
            detail="shadow mode: recorded, not sent", attempts=0, duration_s=0.0,
            targets={ROUTER: TargetResult(ROUTER, SHADOW), AUTOSCALER: TargetResult(AUTOSCALER, SHADOW)},
        )

    def sent(self) -> list[dict[str, Any]]:
        """What would have been sent, oldest first.

        Each record: {decision_id, generation, at_s, router: {...}, autoscaler: {...}}.
        """
        with self._lock:
            return list(self._records)

    def fleet_state(self) -> FleetStateView | None:
        return None

    def components(self) -> tuple[TargetHealth, ...]:
        detail = f"shadow: {len(self._records)} decision(s) recorded, nothing sent"
        return (TargetHealth("actuator:shadow", True, detail),)

    def health(self) -> tuple[bool, str]:
        return True, "shadow: nothing is sent"

    def close(self) -> None:
        pass
