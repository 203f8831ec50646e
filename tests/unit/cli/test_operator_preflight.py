"""``rooftop operator`` without a cluster says so in one line and exits, before kopf.

Before the pre-flight, kopf logged a traceback and retried every 60 s. The operator runs
as a user runs it (a subprocess) with no kubeconfig, with one whose server is not there,
and, for the pre-flight alone, against a stand-in API server that answers ``/version``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: not-a-real-token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


def run(command: list[str], tmp_path: Path, kubeconfig: Path) -> tuple[int, str, str, float]:
    """``command`` outside any cluster (no in-cluster variables, an empty HOME) with
    ``KUBECONFIG=kubeconfig``: exit code, stdout, stderr, seconds taken."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    ours = os.pathsep.join([str(ROOT / "planner"), str(ROOT / "operator")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env |= {"PYTHONPATH": ours, "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
    started = time.monotonic()
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started


def operator(*args: str) -> list[str]:
    return [sys.executable, "-m", "rooftop_cli.main", "operator", *args]


def test_no_kubeconfig_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, _, err, took = run(operator("-A"), tmp_path, tmp_path / "missing")
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("rooftop operator: no Kubernetes configuration: not in a cluster")
    assert f"KUBECONFIG={tmp_path / 'missing'} not found" in err
    assert took < 30  # kopf, had it started, retries every 60 s


def test_an_unreachable_api_server_is_one_line_and_exit_1(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(server="https://127.0.0.1:1"))
    code, _, err, took = run(operator("--namespace", "ns"), tmp_path, kubeconfig)
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("rooftop operator: cannot reach the API server at https://127.0.0.1:1")
    assert took < 30


def test_an_unusable_kubeconfig_names_the_file(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")  # no context
    code, _, err, _ = run(operator("-A"), tmp_path, kubeconfig)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"the kubeconfig (KUBECONFIG={kubeconfig}) is unusable" in err


class _Version(BaseHTTPRequestHandler):
    """A stand-in API server: ``/version`` answers with the class's ``status``."""

    status = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"major": "1", "minor": "31", "gitVersion": "v1.31.0"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Handler", (_Version,), {"status": getattr(request, "param", 200)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


CHECK = [
    sys.executable, "-c",
    "import sys; from rooftop_operator.__main__ import preflight; sys.exit(preflight())",
]  # fmt: skip


@pytest.mark.parametrize("api_server", [200, 403], indirect=True)
def test_a_server_that_answers_passes_the_preflight(tmp_path: Path, api_server: str) -> None:
    """What the e2e harness relies on: its kubeconfig's server answers, so kopf starts.
    (403: the server is there; the operator's own calls report their permissions.)"""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(server=api_server))
    code, out, err, _ = run(CHECK, tmp_path, kubeconfig)
    assert (code, out, err) == (0, "", "")


@pytest.mark.parametrize(
    ("api_server", "code", "needle"),
    [(401, 2, "refused the credentials (HTTP 401)"), (503, 1, "cannot reach the API server")],
    indirect=["api_server"],
)
def test_refused_credentials_and_a_failing_server_stop_the_operator(
    tmp_path: Path, api_server: str, code: int, needle: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(server=api_server))
    got, _, err, _ = run(CHECK, tmp_path, kubeconfig)
    assert got == code and err.count("\n") == 1 and needle in err, err


def test_the_help_documents_the_exit_codes(tmp_path: Path) -> None:
    code, out, _, _ = run(operator("--help"), tmp_path, tmp_path / "missing")
    assert code == 0
    assert "exit codes:" in out and "cannot be reached" in out and "Kubernetes configuration" in out
