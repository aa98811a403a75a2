"""The levers on the wire: each lever's value read from and written to its field of control.proto.

One mapping for every side that speaks RouterControl / AutoscalerControl (the gRPC actuator, the
picker, the simulator's control plane), driven by the lever table (controller/levers.py): a lever's
`proto` names its message and field ("PoolRouting.weights.prefix"), so adding a lever adds no code here.

- `wire_levers(message)`: the levers a message carries, in the message's field order (the order
  checks report them in);
- `put(msg, lever, value)` / `get(msg, lever)`: one value; a lever inside a sub-message (the scorer
  weights) reads None when the sub-message is absent (the command leaves those levers as they are);
- `values(msg, message)`: every lever a message carries, by lever name (absent ones left out).

Must not: validate meta or generations (command_rules.py), apply anything, or import the controller's deciders.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from controller.gen.governor.v1 import control_pb2 as pb
from controller.levers import Lever, levers


def _number(message: str, path: tuple[str, ...]) -> tuple[int, ...]:
    """The field numbers along a lever's path in its message (the order a message's fields come in)."""
    desc = getattr(pb, message).DESCRIPTOR
    out = []
    for name in path:
        f = desc.fields_by_name[name]
        out.append(f.number)
        desc = f.message_type
    return tuple(out)


@cache
def _wire_levers(message: str, names: tuple[str, ...]) -> tuple[Lever, ...]:
    found = [lv for lv in levers() if lv.message == message and lv.name in names]
    return tuple(sorted(found, key=lambda lv: _number(message, lv.path)))


def wire_levers(message: str) -> tuple[Lever, ...]:
    """The levers `message` (PoolRouting, ClassAdmission, PoolScaling) carries, in its field order."""
    return _wire_levers(message, tuple(lv.name for lv in levers() if lv.message == message))


def put(msg: Any, lv: Lever, value: float) -> None:
    """Write `value` into the lever's field of `msg` (a sub-message on the way is created)."""
    *subs, last = lv.path
    for s in subs:
        msg = getattr(msg, s)
    setattr(msg, last, value)


def get(msg: Any, lv: Lever) -> Any:
    """The lever's value in `msg`, or None when it sits in a sub-message the message leaves out."""
    *subs, last = lv.path
    for s in subs:
        if not msg.HasField(s):
            return None
        msg = getattr(msg, s)
    return getattr(msg, last)


def values(msg: Any, message: str) -> dict[str, Any]:
    """Every lever `msg` carries, by lever name (levers in an absent sub-message left out)."""
    out = {}
    for lv in wire_levers(message):
        v = get(msg, lv)
        if v is not None:
            out[lv.name] = v
    return out


def build(message: str, head: dict[str, Any], vals: Any) -> Any:
    """A `message` with `head` (its key: pool or priority_class) and each lever's value from `vals`
    (a mapping by lever name, or an object with the levers' fields as attributes)."""
    msg = getattr(pb, message)(**head)
    for lv in wire_levers(message):
        v = vals[lv.name] if isinstance(vals, dict) else getattr(vals, lv.field)
        put(msg, lv, v)
    return msg
