"""Scenario files: what fleet to simulate, with what traffic, SLOs, tasks and faults.

A scenario is YAML validated by the pydantic models below; `load_scenario` turns
any problem into a ScenarioError naming the file, the line and the field. The
format is documented in docs/SIMULATOR.md. Relative trace paths are resolved
against the scenario file's directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controller.config.catalogue import CatalogueSettings
from controller.names import EngineKind
from controller.perf.catalogue import MODELS as CATALOGUE_MODELS
from controller.perf.catalogue import SKUS as CATALOGUE_SKUS
from controller.perf.engines import Catalogue
from controller.types import PRIORITY_CLASSES

# Any catalogue model and SKU (controller/perf/catalogue.py), or one the scenario declares under
# `catalogue:` (the daemon config's schema): the calibrated Llama ones on A100/H100 are timed by the
# calibrated model, the others by the roofline prior.
SKUS = tuple(CATALOGUE_SKUS)
MODELS = tuple(CATALOGUE_MODELS)
# Engine cap bounds (vLLM's flags), the one copy: the schema, Fleet.set_pool_target and the
# live control plane all check against these.
MAX_NUM_SEQS_RANGE = (1, 4096)
MAX_NUM_BATCHED_TOKENS_RANGE = (16, 262144)


class ScenarioError(ValueError):
    """A scenario (or the trace it names) is malformed. The message names file, line and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SurgeSpec(_Strict):
    """Multiply the arrival rate by `factor` from `at_s` (after time scaling), ramping over `ramp_s`.

    The multiplier rises linearly from 1 to `factor` over [at_s, at_s + ramp_s], holds, and drops
    back to 1 at at_s + duration_s (duration_s includes the ramp)."""

    at_s: float = Field(ge=0)
    factor: float = Field(default=5.0, gt=1.0, le=50.0)
    ramp_s: float = Field(default=60.0, ge=0)
    duration_s: float = Field(default=300.0, gt=0)


class SyntheticPrefixSpec(_Strict):
    """Shared prefixes for traces without hash_ids: each request draws a prefix group
    (Zipf-distributed popularity) whose first `prefix_tokens` tokens are shared."""

    groups: int = Field(default=64, ge=1)
    zipf_a: float = Field(default=1.2, gt=1.0)
    prefix_tokens: int = Field(default=1024, ge=0)  # capped at each prompt's length


class ServeGenSpec(_Strict):
    """How to turn the ServeGen per-window rate shape into arrivals."""

    tier: Literal["m-large", "m-mid", "m-small"] = "m-mid"
    mean_rps: float = Field(default=5.0, gt=0)  # rates are rescaled so the mean over the chosen days is this
    # (in trace seconds, before trace.time_scale: mean_rps 0.8 with time_scale 24 gives 19.2 req/s)
    days: float = Field(default=1.0, gt=0, le=14)
    start_day: float = Field(default=0.0, ge=0, lt=14)
    prompt_tokens_mean: int = Field(default=1024, ge=1)
    output_tokens_mean: int = Field(default=200, ge=1)

    @model_validator(mode="after")
    def _span(self) -> ServeGenSpec:
        if self.start_day + self.days > 14 + 1e-9:
            raise ValueError(f"start_day + days ({self.start_day:g} + {self.days:g}) must be <= 14 (the file's span)")
        return self


class MixShiftSpec(_Strict):
    """A prompt/output mix that moves during the run (for prefill/decode splits), resampled from the trace itself.

    The trace's (prompt, output) pairs are split at the median of prompt/output into a prefill-heavy
    half (long prompt for its output) and a decode-heavy half. Each request keeps its arrival time and
    gets a pair drawn (seeded, with replacement) from the prefill-heavy half with probability
    `prefill_heavy_frac(t)`, linear between the points `(at_s[k], prefill_heavy_frac[k])` (after time
    scaling; constant before the first and after the last point), else from the decode-heavy half.
    0.5 everywhere keeps the trace's own mix in distribution. Nothing is invented: every pair is one
    the trace holds."""

    at_s: list[float] = Field(min_length=1)
    prefill_heavy_frac: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _points(self) -> MixShiftSpec:
        if len(self.at_s) != len(self.prefill_heavy_frac):
            raise ValueError(f"at_s ({len(self.at_s)} points) and prefill_heavy_frac "
                             f"({len(self.prefill_heavy_frac)}) must have the same length")
        if any(b <= a for a, b in zip(self.at_s, self.at_s[1:], strict=False)) or self.at_s[0] < 0:
            raise ValueError(f"at_s must be >= 0 and strictly increasing (got {self.at_s})")
        if any(not 0.0 <= f <= 1.0 for f in self.prefill_heavy_frac):
            raise ValueError(f"prefill_heavy_frac values must be in [0, 1] (got {self.prefill_heavy_frac})")
        return self


class TraceSpec(_Strict):
    path: str
    format: Literal["auto", "azure", "mooncake", "servegen", "jsonl", "csv"] = "auto"
    start_s: float = Field(default=0.0, ge=0)  # window of the original trace, in trace seconds
    duration_s: float | None = Field(default=None, gt=0)
    time_scale: float = Field(default=1.0, gt=0)  # >1 compresses time: arrival_s /= time_scale
    rate_scale: float = Field(default=1.0, gt=0, le=100)  # <1 thins, >1 adds resampled requests (seeded)
    hash_block_tokens: int = Field(default=512, ge=16)  # tokens per hash block (Mooncake: 512)
    prefixes: SyntheticPrefixSpec | None = None
    servegen: ServeGenSpec | None = None
    surge: SurgeSpec | None = None
    mix_shift: MixShiftSpec | None = None  # traces without their own hash ids only


class EngineSpec(_Strict):
    max_num_seqs: int = Field(default=256, ge=MAX_NUM_SEQS_RANGE[0], le=MAX_NUM_SEQS_RANGE[1])
    max_num_batched_tokens: int = Field(default=8192, ge=MAX_NUM_BATCHED_TOKENS_RANGE[0],
                                        le=MAX_NUM_BATCHED_TOKENS_RANGE[1])
    gpu_memory_utilization: float = Field(default=0.9, gt=0.1, le=0.99)
    block_size: int = Field(default=16, ge=1)
    enable_prefix_caching: bool = True
    # which engine's /metrics the replicas serve: vLLM's names, or SGLang's (controller/sim/exposition_sglang.py)
    exposition: EngineKind = "vllm"


class PoolSpecModel(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    model: str
    sku: str
    tp: int = Field(default=1, ge=1, le=8)
    engine: EngineSpec = EngineSpec()
    replicas: int = Field(default=2, ge=0, le=512)  # initial serving replicas
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=64, ge=1, le=1024)
    warm_standby: int = Field(default=0, ge=0)
    startup_warm_s: float = Field(default=30.0, ge=0)  # weights on the node
    startup_cold_s: float = Field(default=180.0, ge=0)  # weights pulled from remote storage
    usd_per_gpu_hour: float | None = Field(default=None, gt=0)  # None: the SKU's default price
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    group: str = "default"  # route group; traffic of a group is split across its pools
    traffic_weight: float = Field(default=1.0, ge=0)
    region: str = ""
    node_gpus: int = Field(default=8, ge=1)  # GPUs per node (for the DCGM exporter view)
    # Tier rule: the share of each class's tasks this pool may serve (class → 0..1; a class not
    # listed: 1, all of it). A task draws u ~ U[0, 1) once (seeded); it may go to this pool iff
    # u < eligible[class], so with {critical: 0, standard: 0.5} half of the standard tasks (the
    # same half for every pool with 0.5) and no critical one may land here. traffic_weight then
    # splits only the traffic eligible for several pools. What may go to a smaller model is a
    # product decision (its quality), stated here, not modelled.
    eligible: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpecModel:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        if not (self.min_replicas <= self.replicas <= self.max_replicas):
            raise ValueError(
                f"replicas ({self.replicas}) must be within [min_replicas, max_replicas] = "
                f"[{self.min_replicas}, {self.max_replicas}]"
            )
        if self.tp > self.node_gpus:
            raise ValueError(f"tp ({self.tp}) must be <= node_gpus ({self.node_gpus})")
        unknown = set(self.eligible) - set(PRIORITY_CLASSES)
        if unknown:
            raise ValueError(f"eligible: unknown priority class {sorted(unknown)}; allowed: {list(PRIORITY_CLASSES)}")
        bad = {c: v for c, v in self.eligible.items() if not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"eligible: shares must be in [0, 1] (got {bad})")
        return self

    def eligible_share(self, priority_class: str) -> float:
        """Share of `priority_class`'s tasks this pool may serve (1 unless the tier rule says less)."""
        return self.eligible.get(priority_class, 1.0)


class AdmissionSpec(_Strict):
    rate_limit_rps: float = Field(default=0.0, ge=0)  # 0 = unlimited
    queue_budget: int = Field(default=-1, ge=-1)  # -1 = unlimited
    shed_frac: float = Field(default=0.0, ge=0, le=1)


class RouterSpec(_Strict):
    prefix_weight: float = Field(default=3.0, ge=0)
    queue_weight: float = Field(default=2.0, ge=0)
    kv_weight: float = Field(default=2.0, ge=0)
    inflight_cap: int = Field(default=0, ge=0)  # per replica; 0 = no cap
    admission: dict[str, AdmissionSpec] = Field(default_factory=dict)
    kv_transfer_gbps: float = Field(default=100.0, gt=0)  # prefill→decode link when disaggregated
    hold_timeout_s: float = Field(default=600.0, gt=0)  # max time a request is held for a pool at zero
    # step-aware admission (controller/sim/router.py): later steps of tasks under way before new tasks' first steps
    step_aware: bool = False

    @model_validator(mode="after")
    def _classes(self) -> RouterSpec:
        unknown = set(self.admission) - set(PRIORITY_CLASSES)
        if unknown:
            raise ValueError(f"admission: unknown priority class {sorted(unknown)}; allowed: {list(PRIORITY_CLASSES)}")
        return self


class ClassSpec(_Strict):
    share: float = Field(ge=0, le=1)  # fraction of tasks in this class
    ttft_slo_s: float = Field(gt=0)
    tpot_slo_s: float = Field(gt=0)


def _default_classes() -> dict[str, ClassSpec]:
    return {
        "critical": ClassSpec(share=0.2, ttft_slo_s=2.5, tpot_slo_s=0.1),
        "standard": ClassSpec(share=0.6, ttft_slo_s=5.0, tpot_slo_s=0.15),
        "sheddable": ClassSpec(share=0.2, ttft_slo_s=10.0, tpot_slo_s=0.3),
    }


class TaskSpec(_Strict):
    """How trace requests are grouped into tasks.

    single: one request per task. session: the turns of a conversation, sent one
    after another with think time; on a trace with its own hash ids (Mooncake) turns
    are found by prefix reuse (every Mooncake request shares block 0, so that block
    is not the key; see controller/sim/workload.py), otherwise steps_min..steps_max
    consecutive requests. workflow: steps_min..steps_max consecutive requests; step
    i+1 is sent think_time_s after step i returns. agentic (traces with their own hash
    ids): every trace request becomes one task of steps_min..steps_max calls whose
    prompts are growing prefixes of that request's prompt (controller/sim/workload.py).
    """

    kind: Literal["single", "session", "workflow", "agentic"] = "single"
    steps_min: int = Field(default=1, ge=1, le=64)
    steps_max: int = Field(default=1, ge=1, le=64)
    think_time_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _steps(self) -> TaskSpec:
        if self.steps_min > self.steps_max:
            raise ValueError(f"steps_min ({self.steps_min}) must be <= steps_max ({self.steps_max})")
        return self


OverQuota = Literal["shed", "queue"]


def _default_over_quota() -> dict[str, OverQuota]:
    return {"critical": "queue", "standard": "queue", "sheddable": "shed"}


class TenantSpec(_Strict):
    """One tenant: its share of the tasks, its class mix, its quota and an optional surge of its own.

    quota_rps: a token bucket per tenant, refilled at quota_rps and holding quota_burst_s seconds of
    tokens (at least one), checked after the class admission (controller/sim/router.py). A request over quota is,
    per class, `shed` (429 at once; the client may retry) or `queue`d: it takes the next token ahead
    of time and is sent on when that token is due, unless that is later than its class's TTFT SLO (a
    request delayed that long has missed its SLO before it starts) or the client's timeout, then it is
    shed."""

    share: float = Field(gt=0, le=1)  # fraction of the trace's requests from this tenant
    classes: dict[str, float] | None = None  # class mix of its tasks; None: the scenario's class shares
    quota_rps: float = Field(default=0.0, ge=0)  # 0 = no quota
    # Bucket depth in seconds of quota: API rate limits are stated per minute (requests per minute),
    # so a minute's worth may arrive at once; a shorter depth turns a bursty tenant's bursts away.
    quota_burst_s: float = Field(default=60.0, gt=0)
    over_quota: dict[str, OverQuota] = Field(default_factory=_default_over_quota)
    surge: SurgeSpec | None = None  # this tenant's rate alone multiplied (copies of its own requests)

    @model_validator(mode="after")
    def _mix(self) -> TenantSpec:
        for what, keys in (("classes", set(self.classes or {})), ("over_quota", set(self.over_quota))):
            unknown = keys - set(PRIORITY_CLASSES)
            if unknown:
                raise ValueError(f"{what}: unknown priority class {sorted(unknown)}; allowed: {list(PRIORITY_CLASSES)}")
        if self.classes is not None:
            total = sum(self.classes.values())
            if any(v < 0 for v in self.classes.values()) or abs(total - 1.0) > 1e-6:
                raise ValueError(f"classes: shares must be >= 0 and sum to 1 (got {total:g})")
        return self

    def class_shares(self, default: dict[str, float]) -> dict[str, float]:
        return dict(self.classes) if self.classes is not None else dict(default)


class ClientSpec(_Strict):
    timeout_s: float = Field(default=120.0, gt=0)  # client gives up (and may retry) after this
    max_retries: int = Field(default=2, ge=0, le=10)  # per request, only before any token streamed
    retry_backoff_s: float = Field(default=1.0, ge=0)
    retry_on_shed: bool = True


class FaultSpec(_Strict):
    kind: Literal["crash", "preempt", "slow"]
    pool: str
    at_s: float | None = Field(default=None, ge=0)  # scheduled once at this time, or...
    rate_per_hour: float | None = Field(default=None, gt=0)  # ...Poisson at this rate per replica
    count: int = Field(default=1, ge=1)  # replicas hit at at_s
    duration_s: float = Field(default=300.0, gt=0)  # slow: how long
    factor: float = Field(default=3.0, gt=1)  # slow: iteration time multiplier

    @model_validator(mode="after")
    def _when(self) -> FaultSpec:
        if (self.at_s is None) == (self.rate_per_hour is None):
            raise ValueError("exactly one of at_s or rate_per_hour must be set")
        return self


class Scenario(_Strict):
    name: str
    description: str = ""
    seed: int = 0
    duration_s: float | None = Field(default=None, gt=0)  # stop after this (simulated); default: end of trace + drain
    trace: TraceSpec
    pools: list[PoolSpecModel] = Field(min_length=1)
    router: RouterSpec = RouterSpec()
    classes: dict[str, ClassSpec] = Field(default_factory=_default_classes)
    tasks: TaskSpec = TaskSpec()
    clients: ClientSpec = ClientSpec()
    faults: list[FaultSpec] = Field(default_factory=list)
    tenants: dict[str, TenantSpec] = Field(default_factory=dict)  # none: one anonymous tenant
    catalogue: CatalogueSettings = CatalogueSettings()  # models and SKUs beyond the built-in catalogue
    base_dir: str = Field(default=".", exclude=True)  # directory of the file; set by load_scenario

    def engine_catalogue(self) -> Catalogue:
        """The built-in catalogue plus the scenario's declarations."""
        return self.catalogue.build()

    @model_validator(mode="after")
    def _cross(self) -> Scenario:
        cat = self.engine_catalogue()
        for i, p in enumerate(self.pools):
            for field, lookup in (("model", cat.model), ("sku", cat.sku)):
                try:
                    lookup(getattr(p, field))
                except ValueError as exc:
                    raise ValueError(f"pools[{i}].{field}: {exc}") from None
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pools: duplicate pool name(s) {dupes}")
        unknown = set(self.classes) - set(PRIORITY_CLASSES)
        if unknown:
            raise ValueError(f"classes: unknown priority class {sorted(unknown)}; allowed: {list(PRIORITY_CLASSES)}")
        total = sum(c.share for c in self.classes.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"classes: shares must sum to 1 (got {total:g})")
        for f in self.faults:
            if f.pool not in names:
                raise ValueError(f"faults: unknown pool {f.pool!r}; pools are {names}")
        groups: dict[str, set[str]] = {}
        for p in self.pools:
            groups.setdefault(p.group, set()).add(p.role)
        for g, roles in groups.items():
            if ("prefill" in roles) != ("decode" in roles):
                raise ValueError(f"pools: group {g!r} has a prefill pool without a decode pool (or the reverse)")
        self._check_tiers()
        self._check_tenants()
        return self

    def _check_tiers(self) -> None:
        """Every task must have a pool: per route group and hop, some pool takes all of each class."""
        used = [c for c, spec in self.classes.items() if spec.share > 0]
        for t in self.tenants.values():
            used += [c for c, v in (t.classes or {}).items() if v > 0]
        for g in sorted({p.group for p in self.pools}):
            for hop in ("first", "decode"):
                members = [p for p in self.pools if p.group == g and (p.role == "decode") == (hop == "decode")]
                if not members:
                    continue
                for c in sorted(set(used)):
                    if max(p.eligible_share(c) for p in members) < 1.0:
                        names = [p.name for p in members]
                        raise ValueError(
                            f"pools: in route group {g!r} no {'decode' if hop == 'decode' else 'first-hop'} pool "
                            f"takes every {c!r} task (eligible < 1 on all of {names}); give one of them "
                            f"eligible.{c}: 1 (or leave it out)")

    def _check_tenants(self) -> None:
        if not self.tenants:
            return
        for name in self.tenants:
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", name):
                raise ValueError(f"tenants: name {name!r} must be lowercase letters, digits and '-' (<= 63)")
        total = sum(t.share for t in self.tenants.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"tenants: shares must sum to 1 (got {total:g})")
        if self.tasks.kind == "session":
            raise ValueError("tenants: tasks.kind session is not supported with tenants (conversations are "
                             "found across the whole trace); use single, workflow or agentic")
        for name, t in self.tenants.items():
            for c, v in (t.classes or {}).items():
                if v > 0 and c not in self.classes:
                    raise ValueError(f"tenants.{name}.classes: class {c!r} has no SLO under classes:")

    def trace_path(self) -> Path:
        p = Path(self.trace.path)
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def pool(self, name: str) -> PoolSpecModel:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


def _line_of(node: yaml.Node | None, loc: tuple[str | int, ...]) -> int | None:
    """Walk a composed YAML node along a pydantic error location; return the 1-based line."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == str(key)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            nxt = node.value[key]
        else:
            nxt = None
        if nxt is None:
            break
        node = nxt
        line = node.start_mark.line + 1
    return line


def parse_scenario(text: str, source: str = "<string>", base_dir: str | Path = ".") -> Scenario:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{source}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a YAML mapping, got {type(data).__name__}")
    data = {**data, "base_dir": str(base_dir)}
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
            line = _line_of(node, loc)
            field = ".".join(str(x) for x in loc) or "(top level)"
            bad = err.get("input")
            shown = "" if isinstance(bad, (dict, list)) or bad is None else f" (got {bad!r})"
            lines.append(f"{source}:{line or '?'}: {field}: {err['msg']}{shown}")
        raise ScenarioError("\n".join(lines)) from None


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario: {exc.strerror}") from None
    return parse_scenario(text, source=str(path), base_dir=path.resolve().parent)
