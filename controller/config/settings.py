"""The daemon's configuration tree: `Settings`, a YAML file plus GOVERNOR_* overrides, and its cross-field checks.

The sections are controller/config/sections.py (Prometheus: prometheus.py; declared models and SKUs:
catalogue.py); loading a file, with every problem named by file and line, is loading.py. Field
checks run first; the single cross-field validator (`Settings._cross_checks`, with
`_adapter_problems` for the Kubernetes section and `checks.auth_problems`) runs once they pass.
`Settings` also gives the rest of the daemon its views: each pool's engine, the `FleetSpec` the core
plans with, a one-line summary. Must not: read files or open anything.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from controller.config.catalogue import CatalogueSettings, catalogue_problems, pool_engines
from controller.config.checks import auth_problems, is_loopback
from controller.config.errors import ProblemsError, field_path
from controller.config.sections import (
    ActuatorsSettings,
    ApiSettings,
    GuardSettings,
    LeaderElectionSettings,
    LogSettings,
    MetricsSettings,
    OtlpSettings,
    PoolSettings,
    SloSettings,
    TelemetrySettings,
)
from controller.names import ENGINE_KINDS, PolicyName, ProfileName
from controller.perf.engines import Engine
from controller.types import PRIORITY_CLASSES, FleetSpec, Mode, PoolSpec, SloSpec

ENV_PREFIX = "GOVERNOR_"
ENV_NESTED_DELIMITER = "__"


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


class Settings(BaseSettings):
    """The whole daemon configuration (see deploy/governor.example.yaml for every key)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER,
                                      extra="forbid", frozen=True, case_sensitive=False)

    mode: Mode = Mode.SHADOW
    profile: ProfileName = "balanced"
    policy: PolicyName = "slo-feedback"
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
        models: dict[str, tuple[int, str]] = {}  # route group → (first pool, its model)
        for i, pool in enumerate(self.pools):
            roles.setdefault(pool.group, set()).add(pool.role)
            first, model = models.setdefault(pool.group, (i, pool.model))
            if model != pool.model:  # the router would send one model's requests to the other's replicas
                p.append((("pools", i, "group"),
                          f"route group {pool.group!r} mixes models: {self.pools[first].name} serves {model!r}, "
                          f"{pool.name} serves {pool.model!r}; give each model its own group (e.g. group: "
                          f"{pool.model})"))
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
            elif t.kind in ENGINE_KINDS:
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
                p.append((where, f"{addr} is also {field_path(seen[addr])}"))
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
            raise ProblemsError(p)
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
