"""The per-class SLO series the burn-rate alerts read (deploy/prometheus/governor-alerts.yml)."""

from __future__ import annotations

from controller.obs.daemon_metrics import DaemonMetrics
from controller.types import ClassObservation, FleetObservation, Reading, SloSpec

SLOS = {"critical": SloSpec(ttft_s=1.0, tpot_s=0.1), "standard": SloSpec(ttft_s=5.0, tpot_s=0.2),
        "sheddable": SloSpec(ttft_s=10.0, tpot_s=0.3)}


def _obs(**classes: ClassObservation) -> FleetObservation:
    return FleetObservation(at_s=1000.0, pools={}, classes=classes)


def test_violation_is_1_over_the_slo_0_within_and_absent_when_unobserved():
    m = DaemonMetrics()
    get = m.registry.get_sample_value
    m.observe_slos(1000.0, _obs(critical=ClassObservation("critical", ttft_p95_s=Reading(1.5)),
                                standard=ClassObservation("standard", ttft_p95_s=Reading(2.0),
                                                          tpot_p95_s=Reading(0.25))), SLOS)
    assert get("governor_class_slo_violation", {"priority": "critical"}) == 1  # TTFT 1.5 > 1.0
    assert get("governor_class_slo_violation", {"priority": "standard"}) == 1  # TPOT 0.25 > 0.2
    assert get("governor_class_slo_violation", {"priority": "sheddable"}) is None  # nothing observed
    assert get("governor_class_ttft_p95_seconds", {"priority": "critical"}) == 1.5
    assert get("governor_class_slo_ttft_seconds", {"priority": "sheddable"}) == 10.0
    assert get("governor_last_tick_timestamp_seconds") == 1000.0

    m.observe_slos(1015.0, _obs(critical=ClassObservation("critical", ttft_p95_s=Reading(0.5))), SLOS)
    assert get("governor_class_slo_violation", {"priority": "critical"}) == 0
    assert get("governor_class_slo_violation", {"priority": "standard"}) is None  # gone unobserved: removed
    assert get("governor_class_ttft_p95_seconds", {"priority": "standard"}) is None
