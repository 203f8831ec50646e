"""A real Prometheus server.

Why real: the operator reads vLLM metrics through PromQL (histogram_quantile over rate()
windows); a fake would only test our idea of Prometheus. ``PrometheusServer`` scrapes
the targets a caller lists in a file_sd directory (the smoke test, the scale benchmark's
hundreds of simulated replicas), with short scrape and refresh intervals (1 s default).
The tests that read an operator's metrics run ``prometheus_operator.GeneratedPrometheus``
on top of it instead: the Prometheus Operator's configuration, Kubernetes discovery.
The binary comes from tests/cluster/fetch-prometheus.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.cluster.controlplane import cache_dir, free_port, parent_death_signal

Sample = dict[str, Any]  # one element of data.result in a Prometheus API answer


def find_prometheus() -> Path | None:
    """The cached binary from fetch-prometheus.sh, else `prometheus` on PATH."""
    cached = cache_dir() / "prometheus" / "bin" / "prometheus"
    if cached.exists() and os.access(cached, os.X_OK):
        return cached
    found = shutil.which("prometheus")
    return Path(found) if found else None


class PrometheusServer:
    """Prometheus on ``host`` (127.0.0.1) scraping whatever `set_targets` lists (job "rooftop").

    `extra_config` is merged into the generated prometheus.yml top level
    (e.g. {"rule_files": [...]}) and `job_config` into the scrape job (e.g.
    {"metric_relabel_configs": [...]}) for tests that need more. `stop()` then `start()`
    restarts it on the same port and storage, as a real outage and recovery would.
    """

    def __init__(
        self,
        workdir: Path,
        binary: Path | None = None,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        scrape_interval: str = "1s",
        extra_config: Mapping[str, Any] | None = None,
        job_config: Mapping[str, Any] | None = None,
    ) -> None:
        binary = binary or find_prometheus()
        if binary is None:
            raise FileNotFoundError("no prometheus binary: run tests/cluster/fetch-prometheus.sh")
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.host = host
        self.scrape_interval = scrape_interval
        self.extra_config = dict(extra_config or {})
        self.job_config = dict(job_config or {})
        self.sd_dir = workdir / "file_sd"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "prometheus.yml"

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        self.sd_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        config = self.config_path
        argv = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=2h",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, start_new_session=True, preexec_fn=parent_death_signal,
            )  # fmt: skip
        self._wait(lambda: self._get("/-/ready") is not None, timeout, "ready")
        return self

    def reload(self) -> None:
        """Rewrite prometheus.yml from the current settings (``job_config`` changed, say)
        and have the running server load it (the lifecycle API; it raises on a config
        the server rejects)."""
        self._write_config()
        if not self.running:
            return
        request = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            if resp.status != 200:
                raise RuntimeError(f"prometheus reload: HTTP {resp.status}\n{self._tail()}")

    def _write_config(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self._config(), indent=2))  # JSON is YAML

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_targets(self, targets: Iterable[tuple[str, Mapping[str, str]]]) -> None:
        """Replace the scraped targets: [("127.0.0.1:8000", {"pod": "x"}), ...].
        Written atomically (rename) so Prometheus never reads half a file."""
        groups = [{"targets": [addr], "labels": dict(labels)} for addr, labels in targets]
        tmp = self.sd_dir / ".targets.json.tmp"
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.sd_dir / "targets.json")

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """Instant query; returns data.result (empty list when no series match)."""
        params = {"query": promql} | ({"time": str(at)} if at is not None else {})
        body = self._get("/api/v1/query?" + urllib.parse.urlencode(params))
        if body is None:
            raise RuntimeError(f"query failed: {promql}\n{self._tail()}")
        result: list[Sample] = body["data"]["result"]
        return result

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[Sample]], bool] = bool,
        timeout: float = 30.0,
    ) -> list[Sample]:
        """Poll `promql` until `predicate(result)` holds (default: non-empty)."""
        last: list[Sample] = []

        def check() -> bool:
            nonlocal last
            last = self.query(promql)
            return predicate(last)

        try:
            self._wait(check, timeout, repr(promql))
        except TimeoutError as e:
            raise TimeoutError(f"{e}\nlast result: {last}") from None
        return last

    def _config(self) -> dict[str, Any]:
        interval = self.scrape_interval
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": "rooftop",
                    "scrape_timeout": interval,
                    "file_sd_configs": [
                        {"files": [str(self.sd_dir / "*.json")], "refresh_interval": interval}
                    ],
                }
                | self.job_config
            ],
        } | self.extra_config

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                raw = resp.read()
        except OSError:
            return None
        return json.loads(raw) if path.startswith("/api/") else raw

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline, delay = time.monotonic() + timeout, 0.05
        while not ready():
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self._proc.returncode})\n{self._tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus: timed out waiting for {what}\n{self._tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
