"""The series Governor reads, named once: the default PromQL (`promql.py`) and Prometheus' histogram
quantiles (`histogram.py`), for every layer that meets an engine's, DCGM's or the router's metrics —
the telemetry sources, the config (which checks query overrides by name), the simulator's exposition
and the picker. Leaves: nothing here imports the rest of controller/ or does I/O.

(The daemon's own `governor_*` series are controller/obs/daemon_metrics.py.)
"""
