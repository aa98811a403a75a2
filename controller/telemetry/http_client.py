"""The HTTP session Governor reads Prometheus with: auth, extra headers and TLS, as configured under
`telemetry.prometheus` (controller/config/prometheus.py).

- bearer token: `Authorization: Bearer <first line of bearer_token_file>`, the file re-read when its
  modification time changes (projected service-account tokens rotate);
- basic auth: username and the first line of `password_file`, read once at start;
- extra headers on every request (e.g. `X-Scope-OrgID` for Mimir/Cortex/Thanos tenants);
- TLS: the CA bundle to verify with, a client certificate and key, and a server name to verify the
  certificate against (and send as SNI) when it differs from the URL's host.

A file that cannot be read is a `CredentialError` at start (naming the file and the setting, never its
contents). Secrets stay out of every message, log line and `repr`. Must not: log anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase, HTTPBasicAuth


class CredentialError(ValueError):
    """A credential file named in the config cannot be used; the message names the setting and the file."""


def read_secret(path: str, setting: str) -> str:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CredentialError(f"{setting}: cannot read {path!r}: {exc.strerror}") from None
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not line:
        raise CredentialError(f"{setting}: {path!r} is empty")
    return line


class BearerTokenFile(AuthBase):
    """`Authorization: Bearer …` from a file, re-read when the file changes."""

    def __init__(self, path: str, setting: str = "telemetry.prometheus.bearer_token_file") -> None:
        self.path = path
        self.setting = setting
        self._mtime = -1.0
        self._token = ""
        self._refresh()

    def _refresh(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError as exc:
            if self._token:
                return  # keep the last good token; the file may be mid-rotation
            raise CredentialError(f"{self.setting}: cannot read {self.path!r}: {exc.strerror}") from None
        if mtime != self._mtime:
            self._token = read_secret(self.path, self.setting)
            self._mtime = mtime

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        self._refresh()
        r.headers["Authorization"] = f"Bearer {self._token}"
        return r

    def __repr__(self) -> str:
        return f"BearerTokenFile({self.path!r})"


class _ServerNameAdapter(HTTPAdapter):
    """Verify the server's certificate against `server_name` (and send it as SNI) instead of the URL's host."""

    def __init__(self, server_name: str) -> None:
        self.server_name = server_name
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args, **kwargs):
        kwargs["server_hostname"] = self.server_name
        kwargs["assert_hostname"] = self.server_name
        return super().init_poolmanager(*args, **kwargs)


def keep_server_name(session: requests.Session, url: str) -> None:
    """PrometheusConnect mounts its own adapter on its URL, which would bypass the server-name one:
    mount the server-name adapter on that URL again (it retries nothing either)."""
    adapter = session.adapters.get("https://")
    if isinstance(adapter, _ServerNameAdapter):
        session.mount(url, adapter)


def build_session(*, bearer_token_file: str | None = None, basic_auth: tuple[str, str] | None = None,
                  headers: Mapping[str, str] | None = None, ca: str | None = None, cert: str | None = None,
                  key: str | None = None, server_name: str | None = None, insecure_skip_verify: bool = False,
                  ) -> tuple[requests.Session, AuthBase | None]:
    """(session, auth) for PrometheusConnect. `basic_auth` is (username, password file).
    CredentialError names a file that cannot be read."""
    session = requests.Session()
    session.headers.update(dict(headers or {}))
    for setting, path in (("tls.ca", ca), ("tls.cert", cert), ("tls.key", key)):
        if path is not None and not Path(path).is_file():
            raise CredentialError(f"telemetry.prometheus.{setting}: {path!r} is not a readable file")
    session.verify = False if insecure_skip_verify else (ca if ca is not None else True)
    if cert is not None and key is not None:
        session.cert = (cert, key)
    if server_name:
        session.mount("https://", _ServerNameAdapter(server_name))
    auth: AuthBase | None = None
    if bearer_token_file is not None:
        auth = BearerTokenFile(bearer_token_file)
    elif basic_auth is not None:
        user, password_file = basic_auth
        auth = HTTPBasicAuth(user, read_secret(password_file, "telemetry.prometheus.basic_auth.password_file"))
    return session, auth
