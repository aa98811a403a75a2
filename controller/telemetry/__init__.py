"""Telemetry in: turn what the fleet exposes into FleetObservations (an edge of the daemon).

- `source.py`: the `TelemetrySource` protocol and `ScrapeTarget`;
- `prometheus.py`: `PrometheusSource`, through the Prometheus HTTP API;
- `http_client.py`: its HTTP session: bearer token / basic auth from files, headers, TLS;
- `scrape.py`: `ScrapeSource`, straight from /metrics endpoints;
- `rules.py`: the same queries as Prometheus recording rules (deploy/prometheus/governor-rules.yml);
- `window.py`: `FamiliesWindow`, rates/quantiles/gauges from scraped families (no HTTP;
  the in-process bench feeds it the simulator's collectors).

The named default PromQL queries live in `controller/metrics/promql.py` (strings only), which
`controller.config` validates overrides against without importing this edge.

`build_source(settings, clock)` picks and builds the configured source. Sources
are imported lazily, so importing the package does not load the HTTP clients.
Nothing here may be imported by `controller.core`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.telemetry.source import ScrapeTarget, TelemetrySource

if TYPE_CHECKING:
    from controller.clock import Clock
    from controller.config import Settings


def build_source(settings: Settings, clock: Clock) -> TelemetrySource:
    """The telemetry source the config asks for (Prometheus or direct scrape)."""
    tel = settings.telemetry
    pools = tuple(p.name for p in settings.pools)
    if tel.source == "prometheus":
        from controller.telemetry.http_client import build_session
        from controller.telemetry.prometheus import PrometheusSource

        prom = tel.prometheus
        basic = (prom.basic_auth.username, prom.basic_auth.password_file) if prom.basic_auth else None
        session, auth = build_session(bearer_token_file=prom.bearer_token_file, basic_auth=basic,
                                      headers=prom.headers, ca=prom.tls.ca, cert=prom.tls.cert, key=prom.tls.key,
                                      server_name=prom.tls.server_name,
                                      insecure_skip_verify=prom.tls.insecure_skip_verify)
        return PrometheusSource(pools, url=prom.url, timeout_s=prom.timeout_s, pool_label=prom.pool_label,
                                window_s=tel.window_s, stale_after_s=tel.stale_after_s, queries=prom.queries,
                                clock=clock, recording_rules=prom.recording_rules, session=session, auth=auth)
    if tel.source == "scrape":
        from controller.telemetry.scrape import ScrapeSource

        targets = [ScrapeTarget(url=t.url, pool=t.pool or "", kind=t.kind) for t in tel.scrape.targets]
        return ScrapeSource(pools, targets=targets, discovery_url=tel.scrape.discovery_url,
                            timeout_s=tel.scrape.timeout_s, window_s=tel.window_s, stale_after_s=tel.stale_after_s)
    raise ValueError(f"telemetry.source: {tel.source!r} is not one of ['prometheus', 'scrape']")


__all__ = ["ScrapeTarget", "TelemetrySource", "build_source"]
