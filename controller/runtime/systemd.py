"""systemd's notify protocol (sd_notify(3)): readiness, watchdog, status, reload and stop messages.

The protocol is one datagram of newline-separated KEY=VALUE assignments sent to the
AF_UNIX socket named by $NOTIFY_SOCKET (a path, or '@name' for the abstract
namespace). It is a few lines over `socket`, so no library is used. Without
$NOTIFY_SOCKET (not started by systemd with Type=notify) every call does nothing.

This module only speaks the protocol; when to speak is the tick loop's choice
(runtime/loop.py): READY=1 after the first tick, WATCHDOG=1 after every tick, so
a hung tick stops the pings and systemd restarts the daemon after WatchdogSec.
It must not decide anything or read the daemon's state itself.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

LOG = logging.getLogger("governor")


def _address(value: str) -> str | bytes:
    """$NOTIFY_SOCKET as a socket address: '@name' is the abstract namespace (a leading NUL byte)."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if not value.startswith("/"):
        raise ValueError(f"NOTIFY_SOCKET must be an absolute path or start with '@' (got {value!r})")
    return value


class SystemdNotifier:
    """Sends sd_notify messages; every method is a no-op when $NOTIFY_SOCKET is unset.

    A send that fails (the manager went away) is logged once and otherwise ignored: the
    daemon's work does not depend on systemd hearing it.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address = _address(raw) if raw else None
        self._sock: socket.socket | None = None
        self._warned = False
        # WATCHDOG_USEC is set when the unit has WatchdogSec=; WATCHDOG_PID, if set, must be us.
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_s: float | None = None
        if usec and (not pid or pid == str(os.getpid())):
            try:
                self.watchdog_s = int(usec) / 1e6
            except ValueError:
                raise ValueError(f"WATCHDOG_USEC must be an integer of microseconds (got {usec!r})") from None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, **fields: str | int) -> bool:
        """Send one datagram with the given assignments (e.g. READY=1, STATUS=...). True if sent."""
        if self._address is None:
            return False
        # A newline would start another assignment: STATUS is free text, so fold it.
        payload = "\n".join(f"{k}={str(v).replace(chr(10), ' ')}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, self._address)
            return True
        except OSError as exc:
            if not self._warned:
                LOG.warning(f"systemd notify to {os.environ.get('NOTIFY_SOCKET', '?')} failed: {exc}",
                            extra={"event": "sd_notify"})
                self._warned = True
            return False

    def ready(self, status: str | None = None) -> bool:
        return self.notify(READY=1, **({"STATUS": status} if status else {}))

    def watchdog(self, status: str | None = None) -> bool:
        return self.notify(WATCHDOG=1, **({"STATUS": status} if status else {}))

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def reloading(self) -> bool:
        # systemd >= 253 wants the CLOCK_MONOTONIC time of the reload request with Type=notify-reload;
        # older managers ignore the extra field.
        return self.notify(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self) -> bool:
        return self.notify(STOPPING=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
