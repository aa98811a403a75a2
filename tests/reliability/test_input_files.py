"""Validate = run for every file and secret the config names (issue 34, part 1).

Each refusal names the config key and the path, and `governor config validate` and `governor run` refuse
with the same line (controller/runtime/preflight.py `file_problems`, `state_problems`): Prometheus' token,
password, CA, certificate and key files; the TLS material of the API, the KEDA scaler and the router
actuator (certificates checked as PEM and against their key); kubeconfigs and the in-cluster service
account; the state directory's owner and permissions. The shipped example config names a Prometheus
password file: it validates only where that file is.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from controller.cli import main
from controller.runtime.preflight import file_problems, preflight, state_problems
from tests.fixtures.tls import make_pki
from tests.reliability.test_input_config import BASE, _both, restore_logging  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    return make_pki(d / "one"), make_pki(d / "two")


CASES = ["prometheus_password_missing", "prometheus_token_empty", "prometheus_ca_not_pem",
         "prometheus_key_of_another_cert", "api_cert_not_pem", "router_client_key_missing", "keda_client_ca_not_pem",
         "kubeconfig_missing", "kubeconfig_without_the_context", "leader_election_outside_a_pod"]


@pytest.mark.parametrize("case", CASES)
def test_each_refusal_names_the_key_and_the_path(tmp_path, capsys, pki, case):
    one, two = pki
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    text = BASE.format(state=tmp_path / "state")
    https = "telemetry:\n  prometheus:\n    url: https://prometheus.test:9090\n"
    if case == "prometheus_password_missing":
        text += f"telemetry:\n  prometheus:\n    basic_auth: {{username: g, password_file: {tmp_path}/pw}}\n"
        expected = f"telemetry.prometheus.basic_auth.password_file: cannot read '{tmp_path}/pw'"
    elif case == "prometheus_token_empty":
        (tmp_path / "token").write_text("\n\n")
        text += f"telemetry:\n  prometheus:\n    bearer_token_file: {tmp_path}/token\n"
        expected = f"telemetry.prometheus.bearer_token_file: '{tmp_path}/token' is empty"
    elif case == "prometheus_ca_not_pem":
        text += https + f"    tls: {{ca: {garbage}}}\n"
        expected = f"telemetry.prometheus.tls.ca: '{garbage}' is not a PEM CA bundle"
    elif case == "prometheus_key_of_another_cert":
        text += https + f"    tls: {{cert: {one.client_cert}, key: {two.client_key}}}\n"
        expected = (f"telemetry.prometheus.tls.cert/key: '{one.client_cert}' and '{two.client_key}' are not a PEM "
                    "certificate and its private key")
    elif case == "api_cert_not_pem":
        text += f"api:\n  tls: {{cert: {garbage}, key: {one.server_key}}}\n"
        expected = f"api.tls.cert/key: '{garbage}' and '{one.server_key}' are not a PEM certificate"
    elif case == "router_client_key_missing":
        text += (f"actuators:\n  router:\n    address: 127.0.0.1:9003\n"
                 f"    tls: {{ca: {one.ca}, cert: {one.client_cert}, key: {tmp_path}/gone.key}}\n")
        expected = f"actuators.router.tls.key: cannot read '{tmp_path}/gone.key'"
    elif case == "keda_client_ca_not_pem":
        text += (f"actuators:\n  keda:\n    enabled: true\n"
                 f"    tls: {{cert: {one.server_cert}, key: {one.server_key}, client_ca: {garbage}}}\n")
        expected = f"actuators.keda.tls.client_ca: '{garbage}' is not a PEM CA bundle"
    elif case == "kubeconfig_missing":
        text += (f"actuators:\n  kubernetes:\n    enabled: true\n    kubeconfig: {tmp_path}/kubeconfig\n"
                 "    pools: [{pool: a, name: vllm-a}]\n")
        expected = f"actuators.kubernetes.kubeconfig: cannot read '{tmp_path}/kubeconfig'"
    elif case == "kubeconfig_without_the_context":
        kc = tmp_path / "kubeconfig"
        kc.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                      "users: [{name: u, user: {}}]\ncontexts: [{name: here, context: {cluster: c, user: u}}]\n"
                      "current-context: here\n")
        text += (f"actuators:\n  kubernetes:\n    enabled: true\n    kubeconfig: {kc}\n    context: elsewhere\n"
                 "    pools: [{pool: a, name: vllm-a}]\n")
        expected = f"actuators.kubernetes.kubeconfig: '{kc}' cannot configure the Kubernetes client"
    else:
        assert not os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")
        text += "leader_election:\n  enabled: true\n  identity: pod-a\n"
        expected = "leader_election.kubeconfig: null means the pod's service account, and there is none here"
    validate_err, run_err = _both(tmp_path, capsys, text)
    assert expected in validate_err, validate_err
    assert expected in run_err, run_err
    assert "Traceback" not in validate_err + run_err


def test_the_same_files_well_formed_validate(tmp_path, pki):
    one, _ = pki
    (tmp_path / "pw").write_text("s3cret\n")
    path = tmp_path / "g.yaml"
    path.write_text(BASE.format(state=tmp_path / "state") + (
        f"telemetry:\n  prometheus:\n    url: https://prometheus.test:9090\n"
        f"    basic_auth: {{username: g, password_file: {tmp_path}/pw}}\n"
        f"    tls: {{ca: {one.ca}, cert: {one.client_cert}, key: {one.client_key}}}\n"
        f"api:\n  tls: {{cert: {one.server_cert}, key: {one.server_key}, client_ca: {one.ca}}}\n"
        f"actuators:\n  router:\n    address: 127.0.0.1:9003\n"
        f"    tls: {{ca: {one.ca}, cert: {one.client_cert}, key: {one.client_key}}}\n"))
    s = preflight(path)
    assert file_problems(s) == []


def test_a_state_directory_the_daemon_cannot_make_private_is_refused(tmp_path, monkeypatch):
    """Owned by someone else and open to the group: the daemon's chmod 0700 at start would fail (as a user other
    than root); an open directory of its own is tightened at start instead (below)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    monkeypatch.setattr("controller.runtime.preflight.os.geteuid", lambda: state.stat().st_uid + 4242)
    problems = state_problems(str(state))
    assert len(problems) == 1 and problems[0].startswith(f"state_dir: '{state}' is mode 0755 and owned by uid "), \
        problems
    monkeypatch.undo()
    assert state_problems(str(state)) == []  # this user owns it: `run` makes it private


def test_run_makes_an_open_state_directory_private(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    path = tmp_path / "g.yaml"
    path.write_text(BASE.format(state=state) + "telemetry:\n  source: scrape\n"
                    "  scrape: {targets: [{url: 'http://127.0.0.1:1/metrics', pool: a}], timeout_s: 0.2}\n")
    assert main(["run", "--config", str(path), "--once", "--headless"]) == 0, capsys.readouterr().err
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "governor.db").stat().st_mode) == 0o600


def test_the_shipped_example_validates_only_where_its_password_file_is(tmp_path, capsys, monkeypatch):
    example = tmp_path / "governor.yaml"
    shutil.copy(ROOT / "deploy" / "governor.example.yaml", example)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", str(example)]) == 2
    err = capsys.readouterr().err
    assert ("telemetry.prometheus.basic_auth.password_file: cannot read '/etc/governor/prometheus-password'"
            in err), err
    (tmp_path / "pw").write_text("hunter2hunter2\n")
    monkeypatch.setenv("GOVERNOR_TELEMETRY__PROMETHEUS__BASIC_AUTH__PASSWORD_FILE", str(tmp_path / "pw"))
    assert main(["config", "validate", str(example)]) == 0, capsys.readouterr().err
    assert "hunter2" not in capsys.readouterr().out
