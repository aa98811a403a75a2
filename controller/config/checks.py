"""Config checks beyond pydantic's field types: strict scalars, the file's size, auth, and start-up I/O.

- `MAX_CONFIG_BYTES` / `check_size`: a config file is a few KB (deploy/governor.example.yaml is 20 KB
  with every key and its comment); parsing took 0.6 s per MB, so anything over 1 MiB is refused
  before it is read, not parsed for half a minute.
- `type_problems(data, model)`: pydantic's lax mode turns YAML `true` into a replica count of 1 and
  `"2.0"` into a price; a config file is written by hand, so a number must be written as a number and
  a boolean as true/false, and NaN/inf are "not a finite number" rather than "should be <= 3600".
  Only the YAML file is checked this way (environment variables are strings by nature), and only a
  *quoted* string is refused where a number belongs: PyYAML reads an unquoted `3.21e9` as a string
  (YAML 1.1 wants `3.21e+9`), which is the file's syntax, not the author's mistake.
- `auth_problems(settings)`: listeners beyond loopback (`is_loopback`) need authentication (API and KEDA
  scaler).
(What start-up would meet beyond the file itself, the state directory and the token and TLS files,
is checked by controller/runtime/preflight.py.) This module reads nothing but what it is given, except the
config file's size, and must not open sockets or start anything.
"""

from __future__ import annotations

import ipaddress
import math
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

MAX_CONFIG_BYTES = 1 << 20

Problem = tuple[tuple[str | int, ...], str]


def check_size(path: Path) -> str | None:
    """Why `path` is too large to be a config file, or None."""
    try:
        size = path.stat().st_size
    except OSError:
        return None  # the read that follows reports it
    if size > MAX_CONFIG_BYTES:
        return (f"{path}: the config file is {size} bytes; at most {MAX_CONFIG_BYTES} are read (a config is a few "
                "KB: is this the right file?)")
    return None


# --------------------------------------------------------------------------- strict scalars


def _unwrap(annotation: Any) -> list[Any]:
    """The alternatives of an annotation with Optional/Annotated removed (`int | None` → [int])."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        out: list[Any] = []
        for a in get_args(annotation):
            if a is not type(None):
                out.extend(_unwrap(a))
        return out
    return [annotation]


def _scalar_problem(kinds: list[Any], value: Any) -> str | None:
    numeric = [k for k in kinds if k in (int, float)]
    if not numeric or any(k not in (int, float) for k in kinds):
        if bool in kinds and not isinstance(value, bool) and all(k in (bool,) for k in kinds):
            return f"{value!r:.60} is not a boolean: write true or false"
        return None  # strings, literals, models: pydantic's own checks are strict enough
    what = "a whole number" if numeric == [int] else "a number"
    if isinstance(value, bool):
        return f"{value} is a boolean, not {what}: write {what}"
    if isinstance(value, str):
        return f"{value[:60]!r} is a string, not {what}: write {what} without quotes"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    if numeric == [int] and isinstance(value, float):
        return f"{value!r} is not a whole number"
    return None


def type_problems(data: Any, model: type[BaseModel], node: yaml.Node | None = None,
                  loc: tuple[str | int, ...] = ()) -> list[Problem]:
    """Scalars in `data` (parsed YAML; `node` its composed tree, for quoting) of the wrong kind for `model`'s
    fields; see the module docstring."""
    out: list[Problem] = []
    if not isinstance(data, Mapping):
        return out
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue  # unknown keys: pydantic names them
        out.extend(_value_problems(_unwrap(field.annotation), value, _child(node, key), (*loc, key)))
    return out


def _child(node: yaml.Node | None, key: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return next((v for k, v in node.value if getattr(k, "value", None) == str(key)), None)
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
        return node.value[key]
    return None


def _value_problems(kinds: list[Any], value: Any, node: yaml.Node | None,
                    loc: tuple[str | int, ...]) -> list[Problem]:
    for k in kinds:
        if isinstance(k, type) and issubclass(k, BaseModel):
            return type_problems(value, k, node, loc)
        origin = get_origin(k)
        if origin is list and isinstance(value, list):
            inner = _unwrap(get_args(k)[0]) if get_args(k) else []
            return [p for i, v in enumerate(value) for p in _value_problems(inner, v, _child(node, i), (*loc, i))]
        if origin is dict and isinstance(value, Mapping):
            args = get_args(k)
            inner = _unwrap(args[1]) if len(args) == 2 else []
            return [p for key, v in value.items()
                    for p in _value_problems(inner, v, _child(node, str(key)), (*loc, str(key)))]
    if isinstance(value, str) and isinstance(node, yaml.ScalarNode) and node.style is None:
        return []  # an unquoted scalar YAML 1.1 left as a string (3.21e9): pydantic reads the number
    problem = _scalar_problem(kinds, value)
    return [(loc, problem)] if problem else []


# --------------------------------------------------------------------------- auth


def is_loopback(listen: str) -> bool:
    """True when a host:port listens on loopback only ('localhost', 127.0.0.0/8, ::1)."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name other than localhost: assume it is reachable from outside


def auth_problems(s: Any) -> list[Problem]:
    """Cross-checks of api and actuators.keda authentication (called by Settings._cross_checks)."""
    p: list[Problem] = []
    api, keda = s.api, s.actuators.keda
    if api.tokens_file is not None and (api.token is not None or api.token_file is not None):
        p.append((("api", "tokens_file"), "set tokens_file (named tokens with roles) or token/token_file, not both"))
    for role_name, role in api.tls.client_roles.items():
        if not role_name.strip():
            p.append((("api", "tls", "client_roles"), f"an empty subject is given role {role}"))
    if api.tls.client_roles and api.tls.client_ca is None:
        p.append((("api", "tls", "client_roles"), "roles of client certificates need mTLS (api.tls.client_ca)"))
    if keda.enabled:
        if (keda.tls.cert is None) != (keda.tls.key is None):
            p.append((("actuators", "keda", "tls"), "cert and key must be set together"))
        if keda.tls.client_ca is not None and keda.tls.cert is None:
            p.append((("actuators", "keda", "tls", "client_ca"), "mTLS needs the server's own cert and key too"))
        if not is_loopback(keda.listen) and keda.token_file is None and keda.tls.client_ca is None:
            p.append((("actuators", "keda", "listen"),
                      f"{keda.listen} is not a loopback address: authenticate KEDA with mTLS "
                      "(actuators.keda.tls.client_ca; KEDA's TriggerAuthentication tlsClientCert/tlsClientKey) or "
                      "set actuators.keda.token_file, or listen on 127.0.0.1"))
    return p
