"""Loading the config: YAML text or a file, laid under GOVERNOR_* variables, validated into `Settings`.

`load_settings(path)` reads the YAML, lays environment variables over it
(`GOVERNOR_MODE=active`, nested keys joined by `__`: `GOVERNOR_API__TOKEN=...`,
`GOVERNOR_TELEMETRY__PROMETHEUS__URL=...`; lists and mappings as JSON) and
validates the result. Every problem is reported at once, each naming the file,
the line (when the key is in the file; the variable when it came from the
environment), the field path, the bad value and what is allowed, e.g.
`governor.yaml:31: pools[1].min_replicas: 9 must be <= max_replicas (4)`.
Unknown keys are rejected by name; duplicate keys and quoted numbers too
(controller/config/checks.py). Must not: read anything but the config file and the
environment, open sockets or start anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_core import ErrorDetails

from controller.config.checks import check_size, type_problems
from controller.config.errors import ConfigError, ProblemsError, field_path
from controller.config.settings import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings


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
                    out.append(f"{source}:{k.start_mark.line + 1}: {field_path((*loc, key))}: duplicate key "
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
    if isinstance(ctx_error, ProblemsError):
        return [(pl, f"{field_path(pl)}: {msg}") for pl, msg in ctx_error.problems]
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = f" (allowed: {', '.join(parent.model_fields)})" if parent is not None else ""
        return [(loc, f"{field_path(loc)}: unknown key{allowed}")]
    if kind == "missing":
        return [(loc, f"{field_path(loc)}: required, but not set")]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    bad = err.get("input")
    if isinstance(bad, (dict, list)) or (bad is None and kind != "none_required"):
        return [(loc, f"{field_path(loc)}: {msg}")]
    if isinstance(ctx_error, ValueError) and repr(bad) in msg:
        return [(loc, f"{field_path(loc)}: {msg}")]
    return [(loc, f"{field_path(loc)}: {_show(bad)} is invalid: {msg}")]


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
    strict = [f"{source}:{_line_of(node, loc) or '?'}: {field_path(loc)}: {msg}"
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

