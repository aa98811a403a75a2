"""The data plane's commands: `governor picker` (flags → PickerConfig, run until SIGINT/SIGTERM) and
the flags of `governor replay` (replay.py runs it).

`governor picker` prints one JSON line {"event": "listening", "extproc": ..., "router_control": ...,
"metrics": ...} on stdout; logs go to stderr. The module imports only argparse at load time (the
CLI builds every parser on each call). Must not: hold picker logic (picker.py) or server
plumbing (server.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.dataplane.server import PickerConfig
    from controller.rpc.transport import TlsConfig

TOKEN_ENV = "GOVERNOR_PICKER_TOKEN"


def control_auth(args: argparse.Namespace) -> tuple[str | None, TlsConfig | None]:
    """The control port's token (--control-token-file, else $GOVERNOR_PICKER_TOKEN) and TLS; ValueError naming the
    flag. The token is never printed."""
    import os
    from pathlib import Path

    from controller.rpc.transport import TlsConfig

    token = None
    if args.control_token_file:
        try:
            token = Path(args.control_token_file).read_text().strip().splitlines()[0].strip() or None
        except (OSError, IndexError) as exc:
            why = getattr(exc, "strerror", None) or "empty"
            raise ValueError(f"--control-token-file {args.control_token_file!r}: cannot read a token ({why})") from None
        if token is None:
            raise ValueError(f"--control-token-file {args.control_token_file!r}: the first line is empty")
    elif os.environ.get(TOKEN_ENV, "").strip():
        token = os.environ[TOKEN_ENV].strip()
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key: give both (the control port's certificate and its key)")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ValueError("--tls-client-ca: mTLS needs the picker's own --tls-cert and --tls-key too")
    tls = None
    if args.tls_cert is not None:
        tls = TlsConfig(args.tls_cert, args.tls_key, args.tls_client_ca)  # read at start: a missing file stops it
    return token, tls


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", action="append", default=[], metavar="POOL=HOST:PORT[,HOST:PORT...]",
                   help="a pool and its replicas' addresses (repeat per pool); POOL=dns:NAME:PORT: every address "
                        "NAME resolves to, re-read every --scrape-interval (a headless Service); or POOL= and let "
                        "--discovery fill it in")
    p.add_argument("--group", action="append", default=[], metavar="GROUP=POOL[,POOL...]",
                   help="a route group and its pools (repeat); default: one group 'default' with every pool")
    p.add_argument("--discovery", default="", metavar="URL",
                   help="Prometheus HTTP service discovery JSON listing the replicas (labels pool, kind=vllm), "
                        "read every --scrape-interval; e.g. `governor sim`'s /sd")
    p.add_argument("--follow", default="", metavar="HOST:PORT",
                   help="copy the routing policy of the picker whose RouterControl listens there, every "
                        "--scrape-interval (run several pickers; Governor commands one)")
    p.add_argument("--class-header", default="x-governor-class", help="header carrying the priority class")
    p.add_argument("--group-header", default="x-governor-route-group", help="header naming the route group")
    p.add_argument("--hold-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="give up on a held request after this long (503); Envoy's message_timeout must be longer")
    p.add_argument("--scrape-interval", type=float, default=1.0, metavar="SECONDS",
                   help="how often to read each engine's /metrics (and the discovery URL)")
    p.add_argument("--block-chars", type=int, default=256, help="characters per prompt block for affinity hashing")
    p.add_argument("--affinity-blocks", type=int, default=4, help="leading prompt blocks that choose a home replica")
    p.add_argument("--default-weight", action="append", default=[], metavar="POOL=W",
                   help="traffic weight in force until Governor speaks and after its policy expires (default 1)")
    p.add_argument("--default-inflight-cap", type=int, default=0, help="default per-replica in-flight cap (0 = none)")
    p.add_argument("--default-scorer", default="3,2,2", metavar="PREFIX,QUEUE,KV",
                   help="default scorer weights (affinity, queue, KV usage)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (all three ports); beyond loopback the "
                   "control port needs --control-token-file or mTLS")
    p.add_argument("--control-token-file", default=None, metavar="FILE",
                   help="RouterControl callers must send 'authorization: Bearer <the file's first line>' (also "
                        f"${TOKEN_ENV}); --follow sends it to the leader")
    p.add_argument("--tls-cert", default=None, metavar="FILE", help="serve the control port over TLS: certificate")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the certificate's private key")
    p.add_argument("--tls-client-ca", default=None, metavar="FILE",
                   help="require client certificates signed by this CA (mTLS); --follow verifies the leader with it "
                        "and presents --tls-cert")
    p.add_argument("--model", action="append", default=[], metavar="POOL=NAME[,NAME...]",
                   help="model names a pool serves (its served model name, LoRA adapters): requests whose `model` is "
                        "one of them go to its route group, an unknown model gets 404; the replicas' GET /v1/models "
                        "adds what they report (repeatable)")
    p.add_argument("--models-interval", type=float, default=10.0, metavar="SECONDS",
                   help="how often each replica's /v1/models is read")
    p.add_argument("--inferencepool", action="append", default=[], metavar="POOL=[NAMESPACE/]NAME",
                   help="the pool's replicas are the ready endpoints of this InferencePool (inference.networking.k8s.io"
                        "/v1): the EndpointSlices of the headless Service of the same name, at its target port; its "
                        "annotation governor.llm-d.ai/models declares model names (repeatable)")
    p.add_argument("--kubeconfig", default=None, metavar="FILE",
                   help="for --inferencepool outside a cluster (default: the pod's service account)")
    p.add_argument("--cold-queue", type=int, default=1024, metavar="N",
                   help="requests held at most at once for route groups with no ready replica (beyond: 429)")
    p.add_argument("--cold-wait", action="append", default=[], metavar="CLASS=SECONDS",
                   help="how long a class waits for a route group's first ready replica (0 = not held: 503 at once; "
                        "default critical=300, standard=180, sheddable=0; repeatable)")
    p.add_argument("--tenant", action="append", default=[], metavar="TENANT=RPS,INFLIGHT,WEIGHT",
                   help="a tenant's limits (the x-gateway-inference-fairness-id header names it; * = every tenant "
                        "not named): requests per second (0 = none), requests in flight or held (0 = none), weight "
                        "in the token-weighted fair share of held requests (default 1); repeatable")
    p.add_argument("--step-blind", action="store_true",
                   help="admit by class only: do not hold or shed new tasks' first steps before later steps of "
                        "tasks under way (the default is step-aware; docs/OPERATING.md)")
    p.add_argument("--max-tasks", type=int, default=100_000, metavar="N",
                   help="tasks the picker keeps at most (an LRU: older ones are pushed out and counted evicted)")
    p.add_argument("--task-ttl", type=float, default=600.0, metavar="SECONDS",
                   help="a task idle this long is settled (completed when its step count is unknown, else "
                        "abandoned)")
    p.add_argument("--max-tenants", type=int, default=64, metavar="N",
                   help="distinct tenants kept in state and metrics; later ones share the tenant _other")
    p.add_argument("--extproc-port", type=int, default=9002,
                   help="gRPC port Envoy connects to: ext_proc, its access log and EDS (the replicas it may send "
                        "to) (0 = any)")
    p.add_argument("--control-port", type=int, default=9003, help="RouterControl gRPC port Governor calls (0 = any)")
    p.add_argument("--metrics-port", type=int, default=9004, help="Prometheus /metrics port (0 = any)")


def _split(items: list[str], flag: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{flag} {item!r}: expected NAME=VALUE[,VALUE...]")
        if name in out:
            raise ValueError(f"{flag} {item!r}: {name!r} given twice")
        out[name] = [v.strip() for v in rest.split(",") if v.strip()]
    return out


def config_from_args(args: argparse.Namespace) -> PickerConfig:
    """The PickerConfig the flags describe; ValueError naming the bad flag."""
    from controller.dataplane.model_routing import pool_groups_serving_different_models
    from controller.dataplane.picker import ColdStart
    from controller.dataplane.policy_store import ClassSettings, PoolSettings, Settings
    from controller.dataplane.server import PickerConfig
    from controller.types import PRIORITY_CLASSES

    endpoints = _split(args.pool, "--pool")
    inferencepools: dict[str, tuple[str, str]] = {}
    for pool, refs in _split(args.inferencepool, "--inferencepool").items():
        if len(refs) != 1:
            raise ValueError(f"--inferencepool {pool}: expected POOL=[NAMESPACE/]NAME")
        ns, _, name = refs[0].rpartition("/")
        inferencepools[pool] = (ns or "default", name)
        endpoints.setdefault(pool, [])
    if not endpoints:
        raise ValueError("--pool: name at least one pool (POOL=HOST:PORT,... or POOL= with --discovery, or "
                         "--inferencepool)")
    dns: dict[str, tuple[str, int]] = {}
    for pool, addrs in endpoints.items():
        for a in addrs:
            host, _, port = a.removeprefix("dns:").rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"--pool {pool}: {a!r} is not HOST:PORT or dns:NAME:PORT")
            if a.startswith("dns:"):
                if len(addrs) != 1:
                    raise ValueError(f"--pool {pool}: dns:NAME:PORT stands alone (it lists the pool's replicas)")
                dns[pool] = (host, int(port))
    groups = _split(args.group, "--group") or {"default": sorted(endpoints)}
    grouped = {p for ps in groups.values() for p in ps}
    if grouped != set(endpoints):
        raise ValueError(f"--group: the groups' pools {sorted(grouped)} must be exactly the --pool pools "
                         f"{sorted(endpoints)}")
    try:
        prefix, queue, kv = (float(x) for x in args.default_scorer.split(","))
    except ValueError:
        raise ValueError(f"--default-scorer {args.default_scorer!r}: expected three numbers PREFIX,QUEUE,KV") from None
    weights = {}
    for pool, vals in _split(args.default_weight, "--default-weight").items():
        if pool not in endpoints or len(vals) != 1:
            raise ValueError(f"--default-weight {pool}: expected one of {sorted(endpoints)}=WEIGHT")
        weights[pool] = float(vals[0])
    if args.default_inflight_cap < 0:
        raise ValueError(f"--default-inflight-cap {args.default_inflight_cap}: must be >= 0")
    defaults = Settings({p: PoolSettings(weights.get(p, 1.0), args.default_inflight_cap, prefix, queue, kv)
                         for p in endpoints}, {c: ClassSettings() for c in PRIORITY_CLASSES})
    models = _split(args.model, "--model")
    unknown = sorted(set(models) - set(endpoints))
    if unknown:
        raise ValueError(f"--model: pools {unknown} are not --pool or --inferencepool pools")
    mixed = pool_groups_serving_different_models(groups, {p: set(n) for p, n in models.items()})
    if mixed:
        raise ValueError("--model: " + "; ".join(mixed) + " (give each model its own --group)")
    waits = {c: float(v[0]) for c, v in _split(args.cold_wait, "--cold-wait").items() if v}
    try:
        cold = ColdStart(args.cold_queue, {**ColdStart().wait_s, **waits})
    except ValueError as exc:
        raise ValueError(f"--cold-queue/--cold-wait: {exc}") from None
    token, tls = control_auth(args)
    tenants = tenants_from_args(args.tenant)
    defaults = Settings(defaults.pools, defaults.admission, tenants=tenants, step_aware=not args.step_blind)
    return PickerConfig(groups=groups, endpoints={p: a for p, a in endpoints.items() if a and p not in dns}, dns=dns,
                        discovery_url=args.discovery, follow=args.follow, defaults=defaults,
                        class_header=args.class_header.lower(),
                        group_header=args.group_header.lower(), hold_timeout_s=args.hold_timeout,
                        scrape_interval_s=args.scrape_interval, block_chars=args.block_chars,
                        affinity_blocks=args.affinity_blocks, host=args.host, extproc_port=args.extproc_port,
                        control_port=args.control_port, metrics_port=args.metrics_port, control_token=token,
                        control_tls=tls, models=models, models_interval_s=args.models_interval,
                        inferencepools=inferencepools, kubeconfig=args.kubeconfig, cold=cold, tenants=tenants,
                        step_aware=not args.step_blind, max_tasks=args.max_tasks, task_ttl_s=args.task_ttl,
                        max_tenants=args.max_tenants)


def tenants_from_args(items: list[str]) -> dict:
    """--tenant TENANT=RPS,INFLIGHT,WEIGHT → tenant → TenantSettings; ValueError naming the item."""
    from controller.dataplane.task_book import TenantSettings

    out = {}
    for name, vals in _split(items, "--tenant").items():
        try:
            if not 1 <= len(vals) <= 3:
                raise ValueError(f"{len(vals)} values")
            rps, inflight, weight = vals + ["0", "0", "1"][len(vals):]  # the ones left out: no limit, weight 1
            out[name] = TenantSettings(float(rps), int(inflight), float(weight))
        except ValueError as exc:
            raise ValueError(f"--tenant {name}={','.join(vals)}: expected RPS,INFLIGHT,WEIGHT ({exc})") from None
    return out


def cmd_picker(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"governor picker: {exc}", file=sys.stderr)
        return 2

    from controller.dataplane.server import start_picker

    async def main() -> int:
        try:
            running = await start_picker(cfg)
        except (OSError, ValueError) as exc:
            print(f"governor picker: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"event": "listening", **running.listening()}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await running.stop()
        return 0

    return asyncio.run(main())


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="trace file (the simulator's formats: Azure CSV, Mooncake or generic JSONL, "
                                 "generic CSV; see docs/SIMULATOR.md)")
    p.add_argument("--url", required=True, help="base URL of an OpenAI-compatible server (Envoy, a router, a replica)")
    p.add_argument("--chat", action="store_true", help="send /v1/chat/completions instead of /v1/completions")
    p.add_argument("--model", default="", help="the model field to send (default: none; the server's own)")
    p.add_argument("--concurrency", type=int, default=64, help="at most this many requests in flight")
    p.add_argument("--max-requests", type=int, default=1000, help="send at most this many requests")
    p.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                   help="stop sending after this many wall seconds (in-flight requests finish)")
    p.add_argument("--time-scale", type=float, default=1.0, help="> 1 compresses the trace's arrival times")
    p.add_argument("--start", type=float, default=0.0, metavar="SECONDS", help="skip the trace's first SECONDS")
    p.add_argument("--class-mix", default="0.2,0.6,0.2", metavar="CRIT,STD,SHED",
                   help="fractions of requests sent as critical, standard, sheddable (header x-governor-class)")
    p.add_argument("--class-header", default="x-governor-class", help="header carrying the priority class")
    p.add_argument("--max-output", type=int, default=256, help="cap each request's max_tokens")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="per-request timeout")
    p.add_argument("--seed", type=int, default=0, help="seed of the class draw and the prompts' text")
    p.add_argument("--block-tokens", type=int, default=None,
                   help="tokens per prefix block of the trace's hash_ids (default: 512 for Mooncake, else 16)")
