"""Fixtures shared by the telemetry tests."""

from __future__ import annotations

import pytest

from tests.telemetry.canned import LinearFleet


@pytest.fixture
def linear_fleet():
    """A canned fleet on loopback whose counters grow linearly with wall time (see LinearFleet)."""
    fleet = LinearFleet()
    yield fleet
    fleet.stop()
