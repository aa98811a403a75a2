"""The daemon's configuration: one pydantic-settings tree, a YAML file plus GOVERNOR_* overrides.

`load_settings(path)` reads the YAML, lays environment variables over it
(`GOVERNOR_MODE=active`, nested keys joined by `__`: `GOVERNOR_API__TOKEN=...`,
`GOVERNOR_TELEMETRY__PROMETHEUS__URL=...`; lists and mappings as JSON) and
validates the result. Every problem is reported at once, each naming the file,
the line (when the key is in the file; the variable when it came from the
environment), the field path, the bad value and what is allowed, e.g.
`governor.yaml:31: pools[1].min_replicas: 9 must be <= max_replicas (4)`.
Unknown keys are rejected by name. Field checks run first; the single
cross-field validator (`Settings._cross_checks`) runs once they pass.

`deploy/governor.example.yaml` documents every key (a test loads it). This
module only reads the config file (and the environment); it must not open
sockets or start anything.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from controller.config_catalogue import CatalogueSettings, catalogue_problems, pool_engines
from controller.config_checks import auth_problems, check_size, type_problems
from controller.config_prometheus import HttpUrlStr, PrometheusSettings
from controller.perf.engines import Engine
from controller.types import PRIORITY_CLASSES, FleetSpec, Mode, PoolSpec, SloSpec

ENV_PREFIX = "GOVERNOR_"
ENV_NESTED_DELIMITER = "__"


class ConfigError(ValueError):
    """The configuration is invalid. `problems` holds one line per problem (file:line: field: what is wrong)."""

    def __init__(self, problems: Sequence[str], source: str = "config") -> None:
        self.problems = list(problems)
        self.source = source
        head = f"{source}: {len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        super().__init__(head + "\n" + "\n".join(f"  {p}" for p in self.problems))


class _ProblemsError(ValueError):
    """Raised by the cross-field validator: (location, message) pairs, one per problem."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{_path(loc)}: {msg}" for loc, msg in problems))


def _path(loc: Sequence[str | int]) -> str:
    """('pools', 1, 'min_replicas') → 'pools[1].min_replicas'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


# --------------------------------------------------------------------------- field types


def _check_host_port(value: str) -> str:
    """'host:port' (IPv6 in brackets: '[::1]:50051'); port 0..65535 (0 = any free port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:50051)")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: port must be an integer in [0, 65535]")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{value!r}: write an IPv6 host in brackets, e.g. [::1]:50051")
    return value


HostPort = Annotated[str, AfterValidator(_check_host_port)]
Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


def is_loopback(listen: str) -> bool:
    """True when a host:port listens on loopback only ('localhost', 127.0.0.0/8, ::1)."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name other than localhost: assume it is reachable from outside


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- sections


class ScrapeTargetSettings(_Strict):
    url: HttpUrlStr  # full metrics URL, e.g. http://10.0.0.5:8000/metrics
    pool: str | None = None  # required for vllm/sglang/dcgm, absent for the router
    kind: Literal["vllm", "sglang", "dcgm", "router"] = "vllm"


class ScrapeSettings(_Strict):
    discovery_url: HttpUrlStr | None = None  # Prometheus HTTP-SD JSON (the simulator serves /sd)
    targets: list[ScrapeTargetSettings] = Field(default_factory=list)
    timeout_s: float = Field(default=2.0, gt=0, le=60)


class TelemetrySettings(_Strict):
    source: Literal["prometheus", "scrape"] = "prometheus"
    prometheus: PrometheusSettings = PrometheusSettings()
    scrape: ScrapeSettings = ScrapeSettings()
    window_s: float = Field(default=60.0, gt=0, le=3600)
    stale_after_s: float = Field(default=60.0, gt=0, le=3600)


class PoolSettings(_Strict):
    name: Name
    model: str = Field(min_length=1)
    sku: str = Field(min_length=1)
    engine: Literal["vllm", "sglang"] = "vllm"
    gpus_per_replica: int = Field(default=1, ge=1, le=64)
    usd_per_gpu_hour: float = Field(gt=0, le=1000)
    min_replicas: int = Field(default=0, ge=0, le=4096)
    max_replicas: int = Field(default=64, ge=1, le=4096)
    startup_warm_s: float = Field(default=30.0, ge=0, le=7200)
    startup_cold_s: float = Field(default=180.0, ge=0, le=7200)
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    group: str = Field(default="default", min_length=1)
    max_num_seqs: int = Field(default=256, ge=1, le=4096)
    max_num_batched_tokens: int = Field(default=8192, ge=16, le=262144)


class SloClassSettings(_Strict):
    ttft_s: float = Field(gt=0, le=600)  # time to first token
    tpot_s: float = Field(gt=0, le=60)  # time per output token


class SloSettings(_Strict):
    critical: SloClassSettings = SloClassSettings(ttft_s=2.5, tpot_s=0.1)
    standard: SloClassSettings = SloClassSettings(ttft_s=5.0, tpot_s=0.15)
    sheddable: SloClassSettings = SloClassSettings(ttft_s=10.0, tpot_s=0.3)


class ClientTlsSettings(_Strict):
    ca: str | None = None  # CA bundle to verify the server
    cert: str | None = None  # client certificate (mTLS)
    key: str | None = None  # client private key (mTLS)


class ActuatorSettings(_Strict):
    address: HostPort | None = None  # None: nothing to send to (decisions are only recorded)
    timeout_s: float = Field(default=2.0, gt=0, le=60)
    retries: int = Field(default=2, ge=0, le=10)
    backoff_s: float = Field(default=0.2, ge=0, le=30)
    tls: ClientTlsSettings = ClientTlsSettings()


class ServerTlsSettings(_Strict):
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None  # set → clients must present a certificate signed by it (mTLS)


class ApiTlsSettings(ServerTlsSettings):
    client_roles: dict[str, Literal["read", "write"]] = Field(default_factory=dict)  # cert CN/SAN → role
    default_client_role: Literal["read", "write"] = "write"  # a verified certificate not in client_roles


class KedaSettings(_Strict):
    enabled: bool = False
    listen: HostPort = "127.0.0.1:50052"  # beyond loopback: tls.client_ca (KEDA's mTLS) or token_file required
    tls: ServerTlsSettings = ServerTlsSettings()
    token_file: str | None = None  # a tokens file (see api.tokens_file) for callers other than KEDA


# --------------------------------------------------------------------------- Kubernetes and router adapters
# (actuators.kubernetes: controller/actuation/kube.py, kube_actuator.py, routers/)

K8sName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")]  # DNS-1123 subdomain
Flag = Annotated[str, Field(pattern=r"^--[a-z0-9][a-z0-9-]*$")]


class KubernetesPoolSettings(_Strict):
    """The workload serving one pool."""

    pool: str = Field(min_length=1)  # the Governor pool (pools[].name)
    kind: Literal["Deployment", "StatefulSet", "LeaderWorkerSet"] = "Deployment"
    name: K8sName
    namespace: K8sName | None = None  # None: actuators.kubernetes.namespace
    container: str = Field(default="vllm", min_length=1)  # the engine container (its args carry the batch caps)
    port: int = Field(default=8000, ge=1, le=65535)  # the engine's HTTP port in the pod (router membership)
    standby: K8sName | None = None  # an unserved Deployment for warm standby; None: warm standby not carried
    max_num_seqs_flag: Flag | None = None  # None: --max-num-seqs (vllm) / --max-running-requests (sglang)
    max_num_batched_tokens_flag: Flag | None = None  # None: --max-num-batched-tokens / --chunked-prefill-size


class MembershipRouterSettings(_Strict):
    """A router whose worker list follows the ready replicas (its routing policy is its own)."""

    kind: Literal["vllm-router", "sglang-router"]
    url: HttpUrlStr  # its HTTP API, e.g. http://vllm-router.inference.svc:30000
    metrics_url: HttpUrlStr | None = None  # its Prometheus page, e.g. http://...:29000/metrics
    pools: list[str] = Field(default_factory=list)  # the pools whose replicas it fronts; [] = every pool
    timeout_s: float = Field(default=5.0, gt=0, le=60)


class KubernetesSettings(_Strict):
    enabled: bool = False
    namespace: K8sName = "inference"
    kubeconfig: str | None = None  # None: the pod's service account (in-cluster)
    context: str | None = None  # kubeconfig context; None: its current context
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    conflict_retries: int = Field(default=3, ge=0, le=10)  # re-reads after a 409 Conflict, per write
    membership_sync_s: float = Field(default=2.0, gt=0, le=300)  # router membership re-sync between ticks
    pools: list[KubernetesPoolSettings] = Field(default_factory=list)  # one workload per Governor pool
    routers: list[MembershipRouterSettings] = Field(default_factory=list)  # routers that follow the replicas


def _adapter_problems(s: Settings) -> list[tuple[tuple[str | int, ...], str]]:
    """Cross-checks of actuators.kubernetes (called by Settings._cross_checks). The section, its pools and
    its routers take effect only with enabled: true; their names are checked either way."""
    p: list[tuple[tuple[str | int, ...], str]] = []
    acts, names = s.actuators, [pool.name for pool in s.pools]
    kube = acts.kubernetes
    at = ("actuators", "kubernetes")
    workloads = [w.pool for w in kube.pools]
    if kube.enabled:
        if acts.autoscaler.address:
            p.append(((*at, "enabled"), "the Kubernetes adapter is the autoscaler: set actuators.autoscaler.address "
                      "or actuators.kubernetes.enabled, not both"))
        if acts.keda.enabled:
            p.append(((*at, "enabled"), "KEDA's HPA and the Kubernetes adapter would both scale the pools: enable "
                      "actuators.keda or actuators.kubernetes, not both"))
        missing = [n for n in names if n not in workloads]
        if missing:
            p.append(((*at, "pools"), f"no workload for pool(s) {missing}: every pool needs an entry "
                      "(pool, kind, name)"))
    for i, w in enumerate(kube.pools):
        if w.pool not in names:
            p.append(((*at, "pools", i, "pool"), f"{w.pool!r} is not a configured pool (pools: {names})"))
        elif workloads.index(w.pool) != i:
            p.append(((*at, "pools", i, "pool"), f"{w.pool!r} duplicates pools[{workloads.index(w.pool)}]"))
    seen: dict[str, int] = {}
    for i, r in enumerate(kube.routers):
        if r.url in seen:
            p.append(((*at, "routers", i, "url"), f"{r.url!r} duplicates routers[{seen[r.url]}]"))
        seen.setdefault(r.url, i)
        for j, pool in enumerate(r.pools):
            if pool not in names:
                p.append(((*at, "routers", i, "pools", j), f"{pool!r} is not a configured pool (pools: {names})"))
    return p


class ActuatorsSettings(_Strict):
    router: ActuatorSettings = ActuatorSettings()
    autoscaler: ActuatorSettings = ActuatorSettings()
    decision_validity_s: float = Field(default=60.0, gt=0, le=3600)
    keda: KedaSettings = KedaSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()


class ApiSettings(_Strict):
    listen: HostPort = "127.0.0.1:50051"
    token: SecretStr | None = None
    token_file: str | None = None
    tokens_file: str | None = None  # named tokens with roles: tokens: [{name, token, role}] (transport.py)
    tls: ApiTlsSettings = ApiTlsSettings()
    max_overrides: int = Field(default=200, ge=1, le=500)  # active at once; why 200: controller/api/limits.py

    def resolved_token(self) -> str | None:
        """The bearer token: `token`, or the first line of `token_file` (read now). Raises ConfigError if unreadable."""
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is None:
            return None
        try:
            text = Path(self.token_file).read_text().strip()
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
            raise ConfigError([f"api.token_file: cannot read {self.token_file!r}: "
                               f"{getattr(exc, 'strerror', None) or exc}"]) from None
        if not text:
            raise ConfigError([f"api.token_file: {self.token_file!r} is empty"])
        return text.splitlines()[0].strip()


class MetricsSettings(_Strict):
    listen: HostPort | None = "127.0.0.1:9464"  # None: do not serve /metrics


class LogSettings(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class GuardSettings(_Strict):
    max_step_up: int = Field(default=4, ge=1, le=4096)  # replicas added per pool per tick, at most
    max_step_down: int = Field(default=1, ge=1, le=4096)  # replicas removed per pool per tick, at most
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=86400)
    budget_usd_per_hour: float | None = Field(default=None, gt=0)  # None: no budget cap
    min_confidence: float = Field(default=0.0, ge=0, le=1)  # below this model confidence: no scale-down (0 = off)
    max_concurrent_drains: int | None = Field(default=None, ge=1, le=4096)  # per pool; None: unlimited


# --------------------------------------------------------------------------- operations: HA, OpenTelemetry


class ShardSettings(_Strict):
    lease: Name  # the Lease's name (metadata.name) in leader_election.namespace
    pools: list[str] = Field(min_length=1)


class LeaderElectionSettings(_Strict):
    """High availability on a Kubernetes Lease (controller/runtime/leader.py). Off by default."""

    enabled: bool = False
    namespace: str = Field(default="inference", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    identity: str | None = None  # None: $POD_NAME, else the host name
    lease_name: Name = "governor"  # the one Lease when `shards` is empty (all pools)
    shards: list[ShardSettings] = Field(default_factory=list)
    shard: str | None = None  # which of `shards` (by lease name) this daemon governs; required with shards
    address: str | None = None  # published to followers as the leader's address (e.g. $POD_IP:50051)
    lease_duration_s: int = Field(default=15, ge=2, le=3600)
    renew_deadline_s: float = Field(default=10.0, gt=0, le=3600)
    retry_period_s: float = Field(default=2.0, gt=0, le=600)
    clock_skew_margin_s: float = Field(default=2.0, ge=0, le=600)
    timeout_s: float = Field(default=5.0, gt=0, le=60)  # one Lease API call
    kubeconfig: str | None = None  # None: the pod's service account (in-cluster)

    @model_validator(mode="after")
    def _timing(self) -> LeaderElectionSettings:
        if self.retry_period_s >= self.renew_deadline_s:
            raise ValueError(f"retry_period_s ({self.retry_period_s:g}) must be < renew_deadline_s "
                             f"({self.renew_deadline_s:g})")
        if self.renew_deadline_s + self.clock_skew_margin_s >= self.lease_duration_s:
            raise ValueError(f"renew_deadline_s + clock_skew_margin_s ({self.renew_deadline_s:g} + "
                             f"{self.clock_skew_margin_s:g}) must be < lease_duration_s ({self.lease_duration_s}): "
                             "a leader must stop actuating before its lease can expire elsewhere")
        return self

    def problems(self, pool_names: Sequence[str]) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-checks against the pools (called from Settings._cross_checks)."""
        p: list[tuple[tuple[str | int, ...], str]] = []
        leases = [s.lease for s in self.shards]
        owner: dict[str, str] = {}
        for i, shard in enumerate(self.shards):
            if leases.index(shard.lease) != i:
                p.append((("leader_election", "shards", i, "lease"), f"{shard.lease!r} is used by another shard"))
            for j, pool in enumerate(shard.pools):
                if pool not in pool_names:
                    p.append((("leader_election", "shards", i, "pools", j),
                              f"{pool!r} is not a configured pool (pools: {list(pool_names)})"))
                elif pool in owner:
                    p.append((("leader_election", "shards", i, "pools", j),
                              f"{pool!r} is already in shard {owner[pool]!r}: a pool has one leader"))
                owner.setdefault(pool, shard.lease)
        if self.enabled and self.shards and self.shard is None:
            p.append((("leader_election", "shard"), f"required with shards: one of {leases}"))
        if self.shard is not None and self.shard not in leases:
            p.append((("leader_election", "shard"), f"{self.shard!r} is not a shard's lease (shards: {leases})"))
        return p

    def resolved_identity(self) -> str:
        import socket

        return self.identity or os.environ.get("POD_NAME") or socket.gethostname()

    def lease_and_pools(self, pool_names: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """The Lease this daemon contends for and the pools it governs."""
        if self.shard is None:
            return self.lease_name, tuple(pool_names)
        (shard,) = [s for s in self.shards if s.lease == self.shard]
        return shard.lease, tuple(p for p in pool_names if p in shard.pools)


class OtlpSettings(_Strict):
    """OpenTelemetry export over OTLP/gRPC (controller/obs/otel.py). Off while endpoint is unset;
    the Prometheus /metrics endpoint stays on either way."""

    endpoint: str | None = None  # e.g. http://otel-collector.monitoring:4317 (https:// for TLS)
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. {authorization: "Bearer ..."}
    tls: ClientTlsSettings = ClientTlsSettings()  # CA (and client cert for mTLS) for an https endpoint
    traces: bool = True  # a span per tick, a child span per phase
    metrics: bool = True  # the governor_* series, every export_interval_s
    export_interval_s: float = Field(default=30.0, ge=1, le=3600)
    timeout_s: float = Field(default=10.0, gt=0, le=120)
    service_name: str = "governor"

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} must start with http:// (plaintext) or https:// (TLS)")
        return v


# --------------------------------------------------------------------------- the tree


class Settings(BaseSettings):
    """The whole daemon configuration (see deploy/governor.example.yaml for every key)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER,
                                      extra="forbid", frozen=True, case_sensitive=False)

    mode: Mode = Mode.SHADOW
    profile: Literal["cost", "balanced", "latency", "throughput"] = "balanced"
    policy: Literal["static", "hpa", "kpa", "sla-planner", "scorer-kpa", "slo-feedback", "mpc"] = "slo-feedback"
    policy_params: dict[str, Any] = Field(default_factory=dict)
    tick_interval_s: float = Field(default=15.0, ge=0.1, le=3600)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    state_dir: str = "governor-state"
    telemetry: TelemetrySettings = TelemetrySettings()
    pools: list[PoolSettings] = Field(default_factory=list)
    catalogue: CatalogueSettings = CatalogueSettings()  # models and SKUs beyond the built-in catalogue
    slo: SloSettings = SloSettings()
    actuators: ActuatorsSettings = ActuatorsSettings()
    api: ApiSettings = ApiSettings()
    metrics: MetricsSettings = MetricsSettings()
    log: LogSettings = LogSettings()
    guards: GuardSettings = GuardSettings()
    leader_election: LeaderElectionSettings = LeaderElectionSettings()
    otel: OtlpSettings = OtlpSettings()

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the file (the file's contents arrive as init arguments).
        return env_settings, init_settings

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        p: list[tuple[tuple[str | int, ...], str]] = []
        names = [pool.name for pool in self.pools]
        if not self.pools:
            p.append((("pools",), "at least one pool is required"))
        for i, pool in enumerate(self.pools):
            if names.index(pool.name) != i:
                p.append((("pools", i, "name"), f"{pool.name!r} duplicates pools[{names.index(pool.name)}]"))
            if pool.min_replicas > pool.max_replicas:
                p.append((("pools", i, "min_replicas"),
                          f"{pool.min_replicas} must be <= max_replicas ({pool.max_replicas})"))
            if pool.startup_warm_s > pool.startup_cold_s:
                p.append((("pools", i, "startup_warm_s"),
                          f"{pool.startup_warm_s:g} must be <= startup_cold_s ({pool.startup_cold_s:g})"))
        # Every pool's engine (model × SKU × TP) resolves, as `governor run` resolves it.
        cat_problems = catalogue_problems(self.catalogue)
        p.extend(cat_problems)
        if not cat_problems:
            p.extend(pool_engines(self.catalogue, self.pools)[1])
        roles: dict[str, set[str]] = {}
        for pool in self.pools:
            roles.setdefault(pool.group, set()).add(pool.role)
        for group, rs in roles.items():
            if ("prefill" in rs) != ("decode" in rs):
                have, lack = ("prefill", "decode") if "prefill" in rs else ("decode", "prefill")
                i = next(k for k, pool in enumerate(self.pools) if pool.group == group and pool.role == have)
                p.append((("pools", i, "role"), f"group {group!r} has a {have} pool but no {lack} pool"))

        tel = self.telemetry
        if tel.source == "scrape":
            if not tel.scrape.discovery_url and not tel.scrape.targets:
                p.append((("telemetry", "scrape"), "source 'scrape' needs discovery_url or at least one target"))
            if tel.window_s < 2 * self.tick_interval_s:
                p.append((("telemetry", "window_s"), f"{tel.window_s:g} must be >= 2 × tick_interval_s "
                          f"({2 * self.tick_interval_s:g}) with source 'scrape': a rate needs two scrapes"))
        if tel.stale_after_s < self.tick_interval_s:
            p.append((("telemetry", "stale_after_s"),
                      f"{tel.stale_after_s:g} must be >= tick_interval_s ({self.tick_interval_s:g})"))
        urls: dict[str, int] = {}
        for i, t in enumerate(tel.scrape.targets):
            loc = ("telemetry", "scrape", "targets", i)
            if t.url in urls:
                p.append(((*loc, "url"), f"{t.url!r} duplicates targets[{urls[t.url]}]"))
            urls.setdefault(t.url, i)
            if t.kind == "router":
                if t.pool:
                    p.append(((*loc, "pool"), f"{t.pool!r}: a router target serves every pool; leave pool out"))
            elif not t.pool:
                p.append(((*loc, "pool"), f"a {t.kind} target needs a pool (one of {names})"))
            elif t.pool not in names:
                p.append(((*loc, "pool"), f"{t.pool!r} is not a configured pool (pools: {names})"))
            elif t.kind in ("vllm", "sglang"):
                engine = self.pools[names.index(t.pool)].engine
                if engine != t.kind:
                    p.append(((*loc, "kind"), f"{t.kind!r} but pool {t.pool!r} runs {engine!r}"))

        api = self.api
        if api.token is not None and api.token_file is not None:
            p.append((("api", "token_file"), "set token or token_file, not both"))
        if api.token is not None and not api.token.get_secret_value().strip():
            p.append((("api", "token"), "is empty"))
        if not is_loopback(api.listen) and api.token is None and api.token_file is None and not api.tokens_file \
                and api.tls.client_ca is None:
            p.append((("api", "token"), f"required when api.listen ({api.listen}) is not a loopback address: "
                      "set api.token or api.token_file (or listen on 127.0.0.1)"))
        if (api.tls.cert is None) != (api.tls.key is None):
            p.append((("api", "tls"), "cert and key must be set together"))
        if api.tls.client_ca is not None and api.tls.cert is None:
            p.append((("api", "tls", "client_ca"), "mTLS needs the server's own cert and key too"))
        for which in ("router", "autoscaler"):
            tls = getattr(self.actuators, which).tls
            if (tls.cert is None) != (tls.key is None):
                p.append((("actuators", which, "tls"), "cert and key must be set together"))

        listens: list[tuple[tuple[str | int, ...], str]] = [(("api", "listen"), api.listen)]
        if self.metrics.listen is not None:
            listens.append((("metrics", "listen"), self.metrics.listen))
        if self.actuators.keda.enabled:
            listens.append((("actuators", "keda", "listen"), self.actuators.keda.listen))
        seen: dict[str, tuple[str | int, ...]] = {}
        for where, addr in listens:
            if addr in seen and not addr.endswith(":0"):
                p.append((where, f"{addr} is also {_path(seen[addr])}"))
            seen.setdefault(addr, where)

        p.extend(_adapter_problems(self))
        p.extend(auth_problems(self))
        p.extend(self.leader_election.problems(names))

        budget = self.guards.budget_usd_per_hour
        if budget is not None:
            floor = sum(pool.min_replicas * pool.gpus_per_replica * pool.usd_per_gpu_hour for pool in self.pools)
            if floor > budget:
                p.append((("guards", "budget_usd_per_hour"),
                          f"{budget:g} is below the cost of every pool at min_replicas ({floor:g} USD/h)"))
        if p:
            raise _ProblemsError(p)
        return self

    # ------------------------------------------------------------------ views for the rest of the daemon

    def engines(self) -> dict[str, Engine]:
        """Each pool's engine (catalogue names, planner figures, prior physics), by pool name."""
        return pool_engines(self.catalogue, self.pools)[0]

    def fleet_spec(self) -> FleetSpec:
        """The static fleet description the core plans with (price per replica = $/GPU-hour × GPUs;
        model and SKU by their catalogue names, so "l40s" reads as "l40s-48gb")."""
        engines = self.engines()
        pools = tuple(
            PoolSpec(name=p.name, model=engines[p.name].arch.name, sku=engines[p.name].sku.name, engine=p.engine,
                     gpus_per_replica=p.gpus_per_replica,
                     usd_per_replica_hour=p.usd_per_gpu_hour * p.gpus_per_replica, min_replicas=p.min_replicas,
                     max_replicas=p.max_replicas, startup_warm_s=p.startup_warm_s, startup_cold_s=p.startup_cold_s,
                     role=p.role, group=p.group, max_num_seqs=p.max_num_seqs,
                     max_num_batched_tokens=p.max_num_batched_tokens)
            for p in self.pools
        )
        slos = {c: SloSpec(ttft_s=getattr(self.slo, c).ttft_s, tpot_s=getattr(self.slo, c).tpot_s)
                for c in PRIORITY_CLASSES}
        return FleetSpec(pools=pools, slos=slos)

    def pool_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pools)

    def summary(self) -> str:
        """One line: what this config makes the daemon do."""
        tel = self.telemetry
        where = tel.prometheus.url if tel.source == "prometheus" else (
            tel.scrape.discovery_url or f"{len(tel.scrape.targets)} static targets")
        return (f"mode={self.mode.value} policy={self.policy} profile={self.profile} tick={self.tick_interval_s:g}s; "
                f"{len(self.pools)} pool(s) [{', '.join(self.pool_names())}]; telemetry={tel.source} ({where}); "
                f"api={self.api.listen}")


# --------------------------------------------------------------------------- loading


def _compose(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise ConfigError([f"{source}{where}: not valid YAML: {problem}"], source) from None
    return data, node


def _duplicate_keys(node: yaml.Node | None, source: str, loc: tuple = ()) -> list[str]:
    """YAML silently keeps the last of two equal keys; an operator almost never means that."""
    out: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            key = getattr(k, "value", None)
            if isinstance(key, str):
                if key in seen:
                    out.append(f"{source}:{k.start_mark.line + 1}: {_path((*loc, key))}: duplicate key "
                               f"(first at line {seen[key]})")
                seen.setdefault(key, k.start_mark.line + 1)
            out.extend(_duplicate_keys(v, source, (*loc, key)))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.extend(_duplicate_keys(v, source, (*loc, i)))
    return out


def _line_of(node: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    """The 1-based line of the deepest node along `loc` that exists in the file, or None."""
    if node is None:
        return None
    line = None
    for key in loc:
        nxt = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if getattr(k, "value", None) == str(key):
                    nxt, line = v, k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            nxt = node.value[key]
            line = nxt.start_mark.line + 1
        if nxt is None:
            break
        node = nxt
    return line


def _env_name(loc: Sequence[str | int]) -> str | None:
    """The environment variable that set `loc` (or one of its parents), if any is set."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            break
        parts.append(str(part))
        name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(parts)
        for candidate in (name.upper(), name, name.lower()):
            if candidate in os.environ:
                return candidate.upper()
    return None


def _strip(annotation: Any) -> Any:
    """Unwrap Optional/Annotated/list/dict to the model inside, if any."""
    for _ in range(5):
        origin = get_origin(annotation)
        if origin is None:
            return annotation
        args = [a for a in get_args(annotation) if a is not type(None)]
        if origin is dict and len(args) == 2:
            annotation = args[1]
        elif args:
            annotation = args[0]
        else:
            return annotation
    return annotation


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The pydantic model class reached by walking `loc` from Settings (for listing allowed keys)."""
    model: Any = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = _strip(model.model_fields[part].annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _show(value: Any) -> str:
    if isinstance(value, SecretStr):
        return "'**********'"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _format(err: ErrorDetails, source: str, node: yaml.Node | None) -> list[tuple[tuple, str]]:
    """One pydantic error → [(location, 'field: message')] (cross-field errors expand to several)."""
    loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, _ProblemsError):
        return [(pl, f"{_path(pl)}: {msg}") for pl, msg in ctx_error.problems]
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = f" (allowed: {', '.join(parent.model_fields)})" if parent is not None else ""
        return [(loc, f"{_path(loc)}: unknown key{allowed}")]
    if kind == "missing":
        return [(loc, f"{_path(loc)}: required, but not set")]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    bad = err.get("input")
    if isinstance(bad, (dict, list)) or (bad is None and kind != "none_required"):
        return [(loc, f"{_path(loc)}: {msg}")]
    if isinstance(ctx_error, ValueError) and repr(bad) in msg:
        return [(loc, f"{_path(loc)}: {msg}")]
    return [(loc, f"{_path(loc)}: {_show(bad)} is invalid: {msg}")]


def _problems(exc: ValidationError, source: str, node: yaml.Node | None) -> list[str]:
    lines: list[str] = []
    for err in exc.errors():
        for loc, text in _format(err, source, node):
            env = _env_name(loc)
            line = None if env else _line_of(node, loc)
            where = f"{source}:{line}" if line else source
            lines.append(f"{where}: {text}" + (f" (from environment variable {env})" if env else ""))
    return lines


def parse_settings(text: str, source: str = "<string>") -> Settings:
    """Validate YAML text (plus GOVERNOR_* environment overrides) into Settings; raises ConfigError."""
    data, node = _compose(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: the config must be a YAML mapping, got {type(data).__name__}"], source)
    dupes = _duplicate_keys(node, source)
    if dupes:
        raise ConfigError(dupes, source)
    keys = [f"{source}:1: {k!r}: a key must be a string" for k in data if not isinstance(k, str)]
    if keys:
        raise ConfigError(keys, source)
    strict = [f"{source}:{_line_of(node, loc) or '?'}: {_path(loc)}: {msg}"
              for loc, msg in type_problems(data, Settings, node)]
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        rest = [p for p in _problems(exc, source, node) if not _covered(p, strict)]
        raise ConfigError(strict + rest, source) from None
    if strict:
        raise ConfigError(strict, source)
    return settings


def _covered(problem: str, strict: list[str]) -> bool:
    """A pydantic problem at a location the strict check already reported (e.g. NaN's "should be <= 3600")."""
    return any(problem.split(" ", 2)[1] == s.split(" ", 2)[1] for s in strict)


def load_settings(path: str | Path | None) -> Settings:
    """Load a config file (None: defaults and the environment only). Raises ConfigError listing every problem."""
    if path is None:
        return parse_settings("", "(no config file)")
    path = Path(path)
    too_big = check_size(path)
    if too_big:
        raise ConfigError([too_big], str(path))
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the config file: {exc.strerror}"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not a text file (byte {exc.start} is not UTF-8)"], str(path)) from None
    return parse_settings(text, str(path))


# --------------------------------------------------------------------------- CLI handlers


def cmd_schema(args) -> int:
    """`governor config schema`: the config's JSON schema on stdout."""
    print(json.dumps(Settings.model_json_schema(), indent=2))
    return 0


__all__ = ["ConfigError", "Settings", "cmd_schema", "is_loopback", "load_settings", "parse_settings"]
