"""The config's sections: one pydantic model per key of the file below the top level.

Telemetry (the scrape targets; Prometheus is controller/config/prometheus.py), pools, SLOs, the
actuators (gRPC targets, KEDA, the Kubernetes and router-membership adapters), the API, the daemon's
own metrics, logs, guardrails, leader election and OpenTelemetry. Each model forbids unknown keys
and is frozen; the cross-field checks that need the whole tree are `Settings._cross_checks`
(controller/config/settings.py). Must not: read files (except `ApiSettings.resolved_token`, which
reads the token file when the daemon asks) or open anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from controller.config.errors import ConfigError
from controller.config.prometheus import HttpUrlStr, PrometheusSettings
from controller.names import EngineKind, TargetKind

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- sections

class ScrapeTargetSettings(_Strict):
    url: HttpUrlStr  # full metrics URL, e.g. http://10.0.0.5:8000/metrics
    pool: str | None = None  # required for vllm/sglang/dcgm, absent for the router
    kind: TargetKind = "vllm"


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
    engine: EngineKind = "vllm"
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
    tokens_file: str | None = None  # named tokens with roles: tokens: [{name, token, role}] (rpc/transport.py)
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
    # overrides, mode, profile, the audit trail and the refit verdict in a GovernorState object named after the
    # Lease (controller/api/kube_store.py), so a failover keeps them; false: each pod's own state_dir (SQLite)
    shared_state: bool = True

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
