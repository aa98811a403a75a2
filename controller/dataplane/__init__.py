"""The data plane: `governor picker` (an Envoy ext_proc endpoint picker that obeys Governor), Envoy's
bootstrap and process handling, and `governor replay` (a bounded trace replayer over HTTP).

picker.py and policy.py are pure (no I/O, no clock, no gRPC); server.py, scrape.py, envoy.py and
replay.py are the edges.
"""
