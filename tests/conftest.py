"""Shared fixtures. Real parts where they can run here: Prometheus, gRPC on loopback."""

from __future__ import annotations

import pytest

from tests.fixtures.prometheus import PrometheusServer


@pytest.fixture
def prometheus_factory(tmp_path):
    servers: list[PrometheusServer] = []

    def make(**kwargs) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prom{len(servers)}", **kwargs)
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()
