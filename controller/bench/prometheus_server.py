"""A real Prometheus server (Debian's `prometheus` binary) on a free loopback port.

Used by the tests (fixture `prometheus_factory`) and by `governor bench tick --source prometheus`.
Listens on 127.0.0.1 only; `stop()` ends the process. Usage in a test:

    def test_x(prometheus_factory):
        prom = prometheus_factory(static_targets={"pool-a": ["127.0.0.1:8001"]})
        prom.wait_for('up == 1', deadline_s=20)
        prom.query('sum(vllm:num_requests_running)')

`static_targets` maps a `pool` label to host:port targets; `http_sd_url` adds an
HTTP service-discovery job (the simulator serves one). Scrapes every second
by default (`scrape_interval`); `rule_files` are loaded as recording rules,
evaluated every `evaluation_interval` (default: the scrape interval). `web_config` is
Prometheus' own `--web.config.file` (basic auth with bcrypt hashes, TLS): the server then serves
https when it has `tls_server_config`, and this object's own readiness checks and queries use
`ca_file` and `basic_auth` (username, password) to get in.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, deadline_s: float, interval_s: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value or the deadline passes (then raise)."""
    end = time.monotonic() + deadline_s
    last_exc: Exception | None = None
    while time.monotonic() < end:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
            last_exc = exc
        time.sleep(interval_s)
    last = f" (last error: {last_exc})" if last_exc else ""
    raise TimeoutError(f"timed out after {deadline_s}s waiting for {what}{last}")


class PrometheusServer:
    def __init__(self, workdir: Path, static_targets: dict[str, list[str]] | None = None,
                 http_sd_url: str | None = None, scrape_interval: str = "1s",
                 extra_jobs: list[dict] | None = None, rule_files: list[Path] | None = None,
                 evaluation_interval: str | None = None, web_config: dict | None = None,
                 ca_file: Path | None = None, basic_auth: tuple[str, str] | None = None) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("the prometheus binary is not installed (make test installs Debian's package)")
        self.port = free_port()
        tls = bool(web_config and web_config.get("tls_server_config"))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._ssl = ssl.create_default_context(cafile=str(ca_file)) if tls else None
        self._auth = ("Basic " + base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
                      if basic_auth else None)
        jobs: list[dict] = [{"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]}]
        for pool, targets in (static_targets or {}).items():
            jobs.append({"job_name": f"static-{pool}",
                         "static_configs": [{"targets": targets, "labels": {"pool": pool}}]})
        jobs.extend(extra_jobs or [])
        if http_sd_url:
            jobs.append({"job_name": "sim", "http_sd_configs": [{"url": http_sd_url, "refresh_interval": "1s"}]})
        config = {"global": {"scrape_interval": scrape_interval,
                             "evaluation_interval": evaluation_interval or scrape_interval,
                             "scrape_timeout": scrape_interval}, "scrape_configs": jobs}
        if rule_files:
            config["rule_files"] = [str(Path(f).resolve()) for f in rule_files]
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        args = [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        if web_config:
            web = workdir / "web.yml"
            web.write_text(yaml.safe_dump(web_config))
            args.append(f"--web.config.file={web}")
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            args,
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_until(self._ready, 30, what="prometheus /-/ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self.log.name}")
        try:
            with self._open("/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def _open(self, path: str, timeout: float):
        req = urllib.request.Request(self.url + path)
        if self._auth:
            req.add_header("Authorization", self._auth)
        return urllib.request.urlopen(req, timeout=timeout, context=self._ssl)

    def query(self, promql: str) -> list[dict]:
        qs = urllib.parse.urlencode({"query": promql})
        with self._open(f"/api/v1/query?{qs}", timeout=5) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"query failed: {body}")
        return body["data"]["result"]

    def wait_for(self, promql: str, deadline_s: float = 30.0) -> list[dict]:
        """Wait until `promql` returns a non-empty result whose values are not NaN."""

        def check():
            res = self.query(promql)
            return res if res and all(r["value"][1] not in ("NaN",) for r in res) else None

        return wait_until(check, deadline_s, interval_s=0.25, what=f"PromQL {promql!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
