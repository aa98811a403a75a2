"""The config's `telemetry.prometheus` section: where Prometheus (or Thanos, Mimir, a managed service)
is and how to reach it: bearer token or basic auth from files, extra headers (the tenant header
`X-Scope-OrgID` of Mimir/Cortex), TLS with a CA, a client certificate and a server name, and the
read's time budget.

Secrets are never in the config itself: the bearer token and the basic-auth password are read from
files when the daemon starts (`controller/telemetry/http_client.py`), and `__repr__`/summaries show
only the file paths. Must not: read those files or open anything.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from controller.metrics import promql


def check_http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
        raise ValueError(f"{value!r} is not an http:// or https:// URL")
    return value


HttpUrlStr = Annotated[str, AfterValidator(check_http_url)]
# Headers the auth settings own; setting them as plain headers would put a secret in the config.
_RESERVED_HEADERS = ("authorization", "proxy-authorization")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BasicAuthSettings(_Strict):
    username: str = Field(min_length=1)
    password_file: str = Field(min_length=1)  # first line is the password


class PrometheusTlsSettings(_Strict):
    ca: str | None = None  # CA bundle that signed the server's certificate (default: the system's)
    cert: str | None = None  # client certificate (mTLS)
    key: str | None = None  # client private key (mTLS)
    server_name: str | None = None  # name to verify the certificate against (and send as SNI), if not the URL's host
    insecure_skip_verify: bool = False  # do not verify the server at all (testing only)


class PrometheusSettings(_Strict):
    url: HttpUrlStr = "http://127.0.0.1:9090"
    timeout_s: float = Field(default=5.0, gt=0, le=120)  # budget for one whole read (all queries)
    pool_label: str = Field(default="pool", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    queries: dict[str, str] = Field(default_factory=dict)  # name -> PromQL template ($pool, $window)
    # read the series recorded by deploy/prometheus/governor-rules.yml with one query instead of evaluating
    # every default query per read (controller/telemetry/rules.py); overridden queries still run raw
    recording_rules: bool = False
    bearer_token_file: str | None = None  # `Authorization: Bearer <first line>`, re-read when the file changes
    basic_auth: BasicAuthSettings | None = None
    headers: dict[str, str] = Field(default_factory=dict)  # sent with every query, e.g. X-Scope-OrgID: tenant-a
    tls: PrometheusTlsSettings = PrometheusTlsSettings()

    @field_validator("queries")
    @classmethod
    def _known_queries(cls, v: dict[str, str]) -> dict[str, str]:
        problems = []
        for name, text in v.items():
            if name not in promql.QUERIES:
                problems.append(f"unknown query name {name!r} (known: {', '.join(promql.QUERY_NAMES)})")
                continue
            why = promql.template_problem(text)
            if why:
                problems.append(f"query {name!r} {why}")
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("headers")
    @classmethod
    def _plain_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"header {name!r}: use bearer_token_file or basic_auth (a secret does not "
                                 "belong in the config)")
            if not name or any(c in name for c in " :\r\n") or any(c in value for c in "\r\n"):
                raise ValueError(f"header {name!r}: not a valid HTTP header name/value")
        return v

    @model_validator(mode="after")
    def _auth_and_tls(self) -> PrometheusSettings:
        parts = urlsplit(self.url)
        if parts.username or parts.password:
            raise ValueError("url: credentials in the URL would be logged; use basic_auth with a password_file")
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise ValueError("set bearer_token_file or basic_auth, not both")
        t = self.tls
        if (t.cert is None) != (t.key is None):
            raise ValueError("tls: cert and key must be set together")
        tls_set = t.ca or t.cert or t.server_name or t.insecure_skip_verify
        if tls_set and parts.scheme != "https":
            raise ValueError(f"tls is set but url {self.url!r} is not https://")
        if t.insecure_skip_verify and (t.ca or t.server_name):
            raise ValueError("tls: insecure_skip_verify verifies nothing; leave ca and server_name out with it")
        return self
