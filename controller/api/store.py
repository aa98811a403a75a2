"""The daemon's persistent state on SQLite: generation, overrides, audit trail, decision records, mode, profile.

One connection (stdlib sqlite3, WAL journal, synchronous=FULL so a committed
generation survives a power cut) guarded by one lock: safe to share between the
gRPC thread pool and the tick thread. Every mutation is one transaction that also
writes its audit entry, so nothing is ever half-applied. Time is always passed in
(`now_s`); this module never reads a clock.

This module must not know about gRPC or the runtime; it validates values, not requests.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.api.limits import (
    DEFAULT_MAX_OVERRIDES,
    KEEP_EXPIRED_OVERRIDES,
    MAX_AUTHOR,
    MAX_NAME,
    MAX_REASON,
    shown,
    text_problem,
)
from controller.core.objective import RELIABILITY_MAX, RELIABILITY_MIN
from controller.levers import lever
from controller.names import PROFILES, tenant_problem
from controller.types import PRIORITY_CLASSES, Mode, Override

SCHEMA_VERSION = 1
MAX_TTL_S = 7 * 24 * 3600.0  # an override lives at most a week: operators must renew, not forget
MAX_REPLICAS_VALUE = 100_000
MAX_SLO_S = 3600.0
MAX_TEXT = MAX_REASON  # characters in reason (author: MAX_AUTHOR, names and text: MAX_NAME; see api/limits.py)

OVERRIDE_KINDS: tuple[str, ...] = (
    "pin_replicas", "min_replicas", "max_replicas", "freeze", "admission", "slo_ttft", "slo_tpot", "profile",
    "reliability", "tenant_rate_limit", "tenant_max_inflight", "tenant_weight", "step_admission",
)
POOL_KINDS = frozenset({"pin_replicas", "min_replicas", "max_replicas", "freeze"})
CLASS_KINDS = frozenset({"admission", "slo_ttft", "slo_tpot"})
REPLICA_KINDS = frozenset({"pin_replicas", "min_replicas", "max_replicas"})
# tenant kinds (text: the tenant) → the tenant lever whose bounds the value obeys (controller/levers.py)
TENANT_KINDS = {"tenant_rate_limit": "tenant_rate_limit_rps", "tenant_max_inflight": "tenant_max_inflight",
                "tenant_weight": "tenant_weight"}
STEP_ADMISSION = ("aware", "blind")

SYSTEM_AUTHOR = "governor"  # author of entries the daemon writes itself (expiry)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS overrides (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, pool TEXT NOT NULL, priority_class TEXT NOT NULL,
    value REAL NOT NULL, text TEXT NOT NULL, author TEXT NOT NULL, reason TEXT NOT NULL,
    created_s REAL NOT NULL, expires_s REAL NOT NULL, expiry_logged INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS overrides_expires ON overrides (expires_s);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at_s REAL NOT NULL, author TEXT NOT NULL,
    action TEXT NOT NULL, detail TEXT NOT NULL, caller TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, decision_id TEXT NOT NULL UNIQUE, generation INTEGER NOT NULL,
    at_s REAL NOT NULL, mode TEXT NOT NULL, summary TEXT NOT NULL, outcome TEXT NOT NULL,
    pools TEXT NOT NULL, record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_at ON decisions (at_s);
"""


class StoreError(RuntimeError):
    """The state file cannot be opened or used."""


class InvalidRequestError(ValueError):
    """A value failed validation; `field` names it (e.g. "ttl_s"), the message says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: int
    at_s: float
    author: str
    action: str  # e.g. "override.set", "override.delete", "override.expired", "mode.set", "profile.set"
    detail: str
    caller: str = ""  # the authenticated identity ("token:<name>", "cert:<CN>"); "" = unauthenticated/loopback


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """The summary of one recorded decision (the full record: StateStore.get_decision)."""

    decision_id: str
    generation: int
    at_s: float
    mode: str
    summary: str
    outcome: str
    pools: tuple[str, ...]


# --------------------------------------------------------------------------- validation


def _finite(value: Any, field: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidRequestError(field, f"must be a number (got {shown(value)})") from None
    if not math.isfinite(v):
        raise InvalidRequestError(field, f"must be finite (got {shown(value)})")
    return v


def check_text(field: str, value: str, max_len: int, *, required: str | None = None) -> None:
    """InvalidRequestError naming `field` when `value` is too long, holds a control character (api/limits.py)
    or, with `required` (what it is for), is blank."""
    if not isinstance(value, str):
        raise InvalidRequestError(field, f"must be a string (got {type(value).__name__})")
    problem = text_problem(value, max_len)
    if problem is not None:
        raise InvalidRequestError(field, problem)
    if required is not None and not value.strip():
        raise InvalidRequestError(field, f"is required: {required}")


def validate_override(kind: str, *, ttl_s: float, author: str, value: float = 0.0, pool: str = "",
                      priority_class: str = "", text: str = "", reason: str = "",
                      known_pools: Collection[str] | None = None) -> None:
    """Raise InvalidRequestError naming the first bad field. `known_pools` None = do not check pool names.

    Rules: kind one of OVERRIDE_KINDS; 0 < ttl_s <= 7 days; author required; replica kinds and freeze need a
    pool (known to the fleet), replica values are whole numbers >= 0; admission and SLO kinds need a
    priority class; admission value (shed fraction) in 0..1; SLO value in seconds, > 0; profile text one of
    PROFILES; reliability value a probability in RELIABILITY_MIN..RELIABILITY_MAX (the MPC's dial,
    controller/core/objective.py); tenant kinds name the tenant in text ("*": every tenant not named) and their
    value obeys the tenant lever's bounds (controller/levers.py); step_admission text is aware or blind.
    """
    if kind not in OVERRIDE_KINDS:
        raise InvalidRequestError("kind", f"must be one of {', '.join(OVERRIDE_KINDS)} (got {shown(kind)})")
    # Lengths and characters first: nothing below may echo an unbounded or terminal-driving value.
    check_text("author", author, MAX_AUTHOR, required="who sets this override")
    check_text("reason", reason, MAX_REASON)
    for name, s in (("pool", pool), ("priority_class", priority_class), ("text", text)):
        check_text(name, s, MAX_NAME)
    ttl = _finite(ttl_s, "ttl_s")
    if not 0 < ttl <= MAX_TTL_S:
        raise InvalidRequestError("ttl_s", f"must be > 0 and <= {MAX_TTL_S:.0f} (7 days) (got {shown(ttl_s)})")
    v = _finite(value, "value")

    if kind in POOL_KINDS:
        if not pool:
            raise InvalidRequestError("pool", f"is required for a {kind} override")
        if known_pools is not None and pool not in known_pools:
            known = ", ".join(sorted(known_pools)) or "none"
            raise InvalidRequestError("pool", f"unknown pool {shown(pool)} (known: {shown(known, 400)[1:-1]})")
    elif pool:
        raise InvalidRequestError("pool", f"is not used by a {kind} override (got {shown(pool)}); leave it empty")

    if kind in CLASS_KINDS:
        if priority_class not in PRIORITY_CLASSES:
            raise InvalidRequestError("priority_class", f"must be one of {', '.join(PRIORITY_CLASSES)} for a {kind} "
                                                        f"override (got {shown(priority_class)})")
    elif priority_class:
        raise InvalidRequestError("priority_class",
                                  f"is not used by a {kind} override (got {shown(priority_class)}); leave it empty")

    if kind in REPLICA_KINDS:
        if v < 0 or v != int(v) or v > MAX_REPLICAS_VALUE:
            raise InvalidRequestError("value",
                                      f"replicas must be a whole number in 0..{MAX_REPLICAS_VALUE} "
                                      f"(got {shown(value)})")
    elif kind == "admission":
        if not 0.0 <= v <= 1.0:
            raise InvalidRequestError("value", f"shed fraction must be in 0..1 (got {shown(value)})")
    elif kind in ("slo_ttft", "slo_tpot"):
        if not 0.0 < v <= MAX_SLO_S:
            raise InvalidRequestError("value", f"SLO seconds must be > 0 and <= {MAX_SLO_S:.0f} (got {shown(value)})")
    elif kind == "profile":
        if text not in PROFILES:
            raise InvalidRequestError("text", f"profile must be one of {', '.join(PROFILES)} (got {shown(text)})")
    elif kind == "reliability":
        if not RELIABILITY_MIN <= v <= RELIABILITY_MAX:
            raise InvalidRequestError("value", f"reliability must be a probability in "
                                               f"{RELIABILITY_MIN}..{RELIABILITY_MAX} (got {shown(value)})")
    elif kind in TENANT_KINDS:
        bad = tenant_problem(text)
        if bad is not None:
            raise InvalidRequestError("text", f"the tenant of a {kind} override {bad}")
        lv = lever(TENANT_KINDS[kind])
        bad = lv.problem(int(v) if lv.kind is int and v == int(v) else v)
        if bad is not None:
            raise InvalidRequestError("value", f"{lv.label} {bad} (got {shown(value)})")
    elif kind == "step_admission":  # noqa: SIM102 - one branch per kind, each with its own check
        if text not in STEP_ADMISSION:
            raise InvalidRequestError("text", f"step admission must be one of {', '.join(STEP_ADMISSION)} "
                                              f"(got {shown(text)})")


def describe_override(o: Override) -> str:
    """One line for the audit trail, e.g. 'ov-000003 min_replicas pool=a value=4 ttl=900s: launch'."""
    target = " ".join(x for x in (f"pool={o.pool}" if o.pool else "",
                                  f"class={o.priority_class}" if o.priority_class else "") if x)
    if o.kind in TENANT_KINDS:
        what = f"tenant={o.text} value={o.value:g}"
    elif o.kind in ("profile", "step_admission"):
        what = f"text={o.text}"
    else:
        what = "" if o.kind == "freeze" else f"value={o.value:g}"
    ttl = o.expires_s - o.created_s
    parts = [o.override_id, o.kind, target, what, f"ttl={ttl:g}s"]
    line = " ".join(p for p in parts if p)
    return line + (f": {o.reason}" if o.reason else "")


# --------------------------------------------------------------------------- JSON


def to_jsonable(v: Any) -> Any:
    """Plain JSON values: dataclasses → dicts, enums → values, tuples/sets → lists, NaN/±inf → None."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, enum.Enum):
        return to_jsonable(v.value)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: to_jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Mapping):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [to_jsonable(x) for x in v]
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item):
        return to_jsonable(item())
    return str(v)


def _pool_names(pools: Any) -> tuple[str, ...]:
    if pools is None:
        return ()
    if isinstance(pools, Mapping):
        return tuple(str(p) for p in pools)
    if isinstance(pools, str):
        return (pools,)
    return tuple(str(p) for p in pools)


# --------------------------------------------------------------------------- the store


def _private_file(path: Path) -> None:
    """Create `path`'s directory (0700) and the file itself (0600) if missing; make an existing file 0600.
    SQLite gives the -wal and -shm files the database file's permissions."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)


class StateStore:
    def __init__(self, path: str | Path, *, max_decisions: int = 10_000, max_audit: int = 100_000,
                 keep_expired_s: float = MAX_TTL_S, max_overrides: int = DEFAULT_MAX_OVERRIDES) -> None:
        """Open (or create) the state file. `max_decisions` / `max_audit` bound the tables (oldest dropped);
        expired overrides are kept `keep_expired_s` after expiry for `override list --all` (at most
        KEEP_EXPIRED_OVERRIDES of them), then purged; at most `max_overrides` are active at once.

        The file and its WAL are private to the daemon's user (0600, directory 0700 when created here):
        the audit trail names operators and the overrides steer the fleet."""
        if max_decisions < 1 or max_audit < 1 or keep_expired_s < 0 or max_overrides < 1:
            raise ValueError(f"max_decisions, max_audit and max_overrides must be >= 1, keep_expired_s >= 0 "
                             f"(got {max_decisions}, {max_audit}, {max_overrides}, {keep_expired_s})")
        self.path = str(path)
        self.max_decisions = max_decisions
        self.max_audit = max_audit
        self.keep_expired_s = keep_expired_s
        self.max_overrides = max_overrides
        self._lock = threading.RLock()
        # Bumped by every committed write of this process: readers (the API's response cache) compare it to know
        # that nothing they read has changed. Another process writing the same file is not seen; only one daemon
        # writes a state file (the CLI goes through the API).
        self.version = 0
        self._next_expiry_s: float | None = None  # earliest expiry not yet audited; None = read it again
        try:
            if self.path != ":memory:":
                _private_file(Path(self.path))
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA busy_timeout=5000")
            with self._tx() as c:
                # Statement by statement: executescript would commit the open transaction first.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        c.execute(statement)
                row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                elif int(row[0]) > SCHEMA_VERSION:
                    raise StoreError(f"state store {self.path}: schema version {row[0]} is newer than this "
                                     f"Governor understands ({SCHEMA_VERSION})")
                columns = {r[1] for r in c.execute("PRAGMA table_info(audit)")}
                if "caller" not in columns:  # a file written before callers were recorded
                    c.execute("ALTER TABLE audit ADD COLUMN caller TEXT NOT NULL DEFAULT ''")
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a schema_version that is not a number
            raise StoreError(f"{self.path} is not a valid state database ({exc})") from exc

    # ---- plumbing

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: the write lock is taken up front, so read-modify-write is atomic)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                if self._conn.in_transaction:  # SQLite has already rolled back on SQLITE_FULL and a few others:
                    self._conn.execute("ROLLBACK")  # a second ROLLBACK would hide the real error
                raise
            self._conn.execute("COMMIT")
            self.version += 1
            self._next_expiry_s = None

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @staticmethod
    def _get_meta(c: sqlite3.Connection, key: str) -> str | None:
        row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def _set_meta(c: sqlite3.Connection, key: str, value: str) -> None:
        c.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                  (key, value))

    def _audit(self, c: sqlite3.Connection, at_s: float, author: str, action: str, detail: str,
               caller: str = "") -> None:
        c.execute("INSERT INTO audit (at_s, author, action, detail, caller) VALUES (?, ?, ?, ?, ?)",
                  (at_s, author, action, detail, caller))
        c.execute("DELETE FROM audit WHERE seq <= (SELECT seq FROM audit ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                  (self.max_audit,))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- generation

    def next_generation(self) -> int:
        """Issue the next generation (1, 2, ...). Committed before it is returned, so it never repeats."""
        with self._tx() as c:
            n = int(self._get_meta(c, "generation") or 0) + 1
            self._set_meta(c, "generation", str(n))
            return n

    def peek_generation(self) -> int:
        """The last generation issued (0 if none)."""
        with self._lock:
            return int(self._get_meta(self._conn, "generation") or 0)

    def advance_generation_to(self, generation: int) -> int:
        """Make sure the next generation is above `generation` (e.g. what the fleet reports as applied when the
        state file was lost). Returns the last issued generation after the change."""
        with self._tx() as c:
            n = max(int(self._get_meta(c, "generation") or 0), int(generation))
            self._set_meta(c, "generation", str(n))
            return n

    # ---- mode and profile

    def get_mode(self) -> str | None:
        with self._lock:
            return self._get_meta(self._conn, "mode")

    def set_mode(self, mode: str | Mode, *, author: str, now_s: float, reason: str = "",
                 caller: str = "") -> str | None:
        """Persist the mode (audited; `caller` is the authenticated identity). Returns the previous persisted
        mode (None if never set)."""
        mode = mode.value if isinstance(mode, Mode) else str(mode)
        if mode not in {m.value for m in Mode}:
            raise InvalidRequestError("mode", f"must be one of {', '.join(m.value for m in Mode)} (got {shown(mode)})")
        check_text("author", author, MAX_AUTHOR, required="who changes the mode")
        check_text("reason", reason, MAX_REASON)
        with self._tx() as c:
            previous = self._get_meta(c, "mode")
            self._set_meta(c, "mode", mode)
            self._audit(c, now_s, author, "mode.set",
                        f"{previous or 'unset'} → {mode}" + (f": {reason}" if reason else ""), caller)
            return previous

    def get_profile(self) -> str | None:
        with self._lock:
            return self._get_meta(self._conn, "profile")

    def set_profile(self, profile: str, *, author: str, now_s: float, reason: str = "") -> str | None:
        """Persist the base objective profile (audited). Returns the previous one (None if never set)."""
        if profile not in PROFILES:
            raise InvalidRequestError("profile", f"must be one of {', '.join(PROFILES)} (got {profile!r})")
        if not author:
            raise InvalidRequestError("author", "is required")
        with self._tx() as c:
            previous = self._get_meta(c, "profile")
            self._set_meta(c, "profile", profile)
            self._audit(c, now_s, author, "profile.set",
                        f"{previous or 'unset'} → {profile}" + (f": {reason}" if reason else ""))
            return previous

    # ---- overrides

    def add_override(self, kind: str, *, ttl_s: float, author: str, now_s: float, value: float = 0.0,
                     pool: str = "", priority_class: str = "", text: str = "", reason: str = "",
                     known_pools: Collection[str] | None = None, caller: str = "") -> Override:
        """Validate (see validate_override), store and audit one override; active from now_s for ttl_s.
        Refused (field "override") when max_overrides are already active. `caller`: the authenticated
        identity, recorded in the audit entry next to the declared author."""
        validate_override(kind, ttl_s=ttl_s, author=author, value=value, pool=pool, priority_class=priority_class,
                          text=text, reason=reason, known_pools=known_pools)
        check_text("caller", caller, 2 * MAX_AUTHOR)
        if kind in ("freeze", "profile", "step_admission"):
            value = 0.0
        with self._tx() as c:
            active = c.execute("SELECT COUNT(*) FROM overrides WHERE ? < expires_s", (now_s,)).fetchone()[0]
            if active >= self.max_overrides:
                raise InvalidRequestError("override", f"{active} overrides are already active (at most "
                                          f"{self.max_overrides}, api.max_overrides): delete some or let them "
                                          "expire first")
            seq = int(self._get_meta(c, "override_seq") or 0) + 1
            self._set_meta(c, "override_seq", str(seq))
            o = Override(override_id=f"ov-{seq:06d}", kind=kind, value=float(value), pool=pool,
                         priority_class=priority_class, text=text, author=author.strip(), reason=reason,
                         created_s=float(now_s), expires_s=float(now_s) + float(ttl_s))
            c.execute("INSERT INTO overrides (id, kind, pool, priority_class, value, text, author, reason, created_s, "
                      "expires_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (o.override_id, o.kind, o.pool, o.priority_class, o.value, o.text, o.author, o.reason,
                       o.created_s, o.expires_s))
            self._audit(c, now_s, o.author, "override.set", describe_override(o), caller)
        return o

    @staticmethod
    def _override(row: tuple) -> Override:
        oid, kind, pool, cls, value, text, author, reason, created_s, expires_s = row
        return Override(override_id=oid, kind=kind, value=value, pool=pool, priority_class=cls, text=text,
                        author=author, reason=reason, created_s=created_s, expires_s=expires_s)

    _OVERRIDE_COLS = "id, kind, pool, priority_class, value, text, author, reason, created_s, expires_s"

    def get_override(self, override_id: str) -> Override | None:
        rows = self._read(f"SELECT {self._OVERRIDE_COLS} FROM overrides WHERE id=?", (override_id,))
        return self._override(rows[0]) if rows else None

    def list_overrides(self, now_s: float, include_expired: bool = False) -> list[Override]:
        """Overrides active at now_s (created_s <= now_s < expires_s), oldest first; with include_expired also
        the expired ones still kept."""
        if include_expired:
            rows = self._read(f"SELECT {self._OVERRIDE_COLS} FROM overrides ORDER BY created_s, id")
        else:
            rows = self._read(f"SELECT {self._OVERRIDE_COLS} FROM overrides WHERE created_s <= ? AND ? < expires_s "
                              "ORDER BY created_s, id", (now_s, now_s))
        return [self._override(r) for r in rows]

    def active_overrides(self, now_s: float) -> tuple[Override, ...]:
        return tuple(self.list_overrides(now_s))

    def delete_override(self, override_id: str, *, author: str, now_s: float, reason: str = "",
                        caller: str = "") -> bool:
        """Remove an override (audited). False when there is no such id."""
        check_text("id", override_id, MAX_NAME, required="which override to delete")
        check_text("author", author, MAX_AUTHOR, required="who deletes this override")
        check_text("reason", reason, MAX_REASON)
        with self._tx() as c:
            row = c.execute(f"SELECT {self._OVERRIDE_COLS} FROM overrides WHERE id=?", (override_id,)).fetchone()
            if row is None:
                return False
            c.execute("DELETE FROM overrides WHERE id=?", (override_id,))
            self._audit(c, now_s, author.strip(), "override.delete",
                        describe_override(self._override(row)) + (f" (deleted: {reason})" if reason else ""), caller)
            return True

    def expiry_due(self, now_s: float) -> bool:
        """Whether `expire_overrides(now_s)` has an expiry to audit: one read after each write, then none (the
        API calls it on every ListOverrides; the purge of old expired ones is left to the tick's call)."""
        with self._lock:
            if self._next_expiry_s is None:
                row = self._conn.execute("SELECT MIN(expires_s) FROM overrides WHERE expiry_logged = 0").fetchone()
                self._next_expiry_s = math.inf if row is None or row[0] is None else float(row[0])
            return self._next_expiry_s <= now_s

    def expire_overrides(self, now_s: float) -> list[Override]:
        """Audit, once, each override whose TTL has run out by now_s, and purge those expired more than
        keep_expired_s ago. Returns the newly expired ones. Call it every tick."""
        with self._tx() as c:
            rows = c.execute(f"SELECT {self._OVERRIDE_COLS} FROM overrides WHERE expires_s <= ? AND expiry_logged = 0 "
                             "ORDER BY expires_s, id", (now_s,)).fetchall()
            expired = [self._override(r) for r in rows]
            for o in expired:
                self._audit(c, o.expires_s, SYSTEM_AUTHOR, "override.expired", describe_override(o))
            c.execute("UPDATE overrides SET expiry_logged = 1 WHERE expires_s <= ?", (now_s,))
            c.execute("DELETE FROM overrides WHERE expires_s <= ?", (now_s - self.keep_expired_s,))
            # and at most KEEP_EXPIRED_OVERRIDES expired ones, newest kept: `override list --all` stays bounded
            c.execute("DELETE FROM overrides WHERE expires_s <= ? AND id NOT IN (SELECT id FROM overrides WHERE "
                      "expires_s <= ? ORDER BY expires_s DESC, id DESC LIMIT ?)",
                      (now_s, now_s, KEEP_EXPIRED_OVERRIDES))
        return expired

    # ---- audit

    def add_audit(self, author: str, action: str, detail: str, *, now_s: float, caller: str = "") -> None:
        """An audit entry for a mutation made elsewhere (e.g. the runtime switching mode on a signal)."""
        with self._tx() as c:
            self._audit(c, now_s, author, action, detail, caller)

    def list_audit(self, limit: int = 100) -> list[AuditEntry]:
        """Newest first."""
        rows = self._read("SELECT seq, at_s, author, action, detail, caller FROM audit ORDER BY seq DESC LIMIT ?",
                          (int(limit),))
        return [AuditEntry(*r) for r in rows]

    # ---- decisions

    def record_decision(self, record: Mapping[str, Any]) -> None:
        """Store one decision record: keys decision_id, generation, at_s, mode, summary, outcome, pools (names or a
        mapping keyed by pool) and anything else (inputs, policy, reasons, guard_adjustments, overrides,
        diagnostics...), kept whole as JSON. Recording the same decision_id again replaces it (e.g. to add the
        outcome). Only the newest max_decisions are kept."""
        decision_id = record.get("decision_id")
        if not decision_id or not isinstance(decision_id, str):
            raise InvalidRequestError("decision_id", f"is required (got {decision_id!r})")
        try:
            generation = int(record.get("generation") or 0)
            at_s = float(record.get("at_s") or 0.0)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError("generation", f"generation and at_s must be numbers: {exc}") from None
        pools = _pool_names(record.get("pools"))
        outcome = record.get("outcome") or ""
        if not isinstance(outcome, str):  # an ActuationOutcome or its dict: keep its status
            j = to_jsonable(outcome)
            outcome = str(j.get("status", "")) if isinstance(j, dict) else str(j)
        body = json.dumps(to_jsonable(record), allow_nan=False)
        with self._tx() as c:
            c.execute(
                "INSERT INTO decisions (decision_id, generation, at_s, mode, summary, outcome, pools, record) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(decision_id) DO UPDATE SET "
                "generation=excluded.generation, at_s=excluded.at_s, mode=excluded.mode, summary=excluded.summary, "
                "outcome=excluded.outcome, pools=excluded.pools, record=excluded.record",
                (decision_id, generation, at_s, str(record.get("mode") or ""), str(record.get("summary") or ""),
                 outcome, "," + ",".join(pools) + ",", body),
            )
            c.execute("DELETE FROM decisions WHERE seq <= "
                      "(SELECT seq FROM decisions ORDER BY seq DESC LIMIT 1 OFFSET ?)", (self.max_decisions,))

    @staticmethod
    def _decision_row(r: tuple) -> DecisionRow:
        decision_id, generation, at_s, mode, summary, outcome, pools = r
        return DecisionRow(decision_id, generation, at_s, mode, summary, outcome,
                           tuple(p for p in pools.split(",") if p))

    def list_decisions(self, limit: int = 20, since_s: float = 0.0, pool: str = "") -> list[DecisionRow]:
        """Newest first; at_s >= since_s; with `pool`, only decisions that include that pool."""
        sql = "SELECT decision_id, generation, at_s, mode, summary, outcome, pools FROM decisions WHERE at_s >= ?"
        params: list[Any] = [since_s]
        if pool:
            sql += " AND instr(pools, ?) > 0"  # instr, not LIKE: pool names may contain % or _
            params.append("," + pool + ",")
        sql += " ORDER BY at_s DESC, seq DESC LIMIT ?"
        params.append(int(limit))
        return [self._decision_row(r) for r in self._read(sql, tuple(params))]

    def get_decision(self, decision_id: str) -> dict[str, Any] | None:
        """The full record as it was stored (JSON-decoded), or None."""
        rows = self._read("SELECT record FROM decisions WHERE decision_id=?", (decision_id,))
        return json.loads(rows[0][0]) if rows else None

    def get_decision_row(self, decision_id: str) -> DecisionRow | None:
        rows = self._read("SELECT decision_id, generation, at_s, mode, summary, outcome, pools FROM decisions "
                          "WHERE decision_id=?", (decision_id,))
        return self._decision_row(rows[0]) if rows else None
