"""metrics_client against a Prometheus that wants a bearer token, a tenant header and
https with a private CA (OpenShift's thanos-querier, Mimir): a real aiohttp server on
127.0.0.1, with certificates from tests/cluster/pki.py."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tests.cluster import pki

from rooftop_control.readings import MetricState, Reading
from rooftop_operator.metrics_client import MetricsClient, PrometheusAuth
from rooftop_operator.settings import configured, read_settings

ANSWER = {"status": "success", "data": {"resultType": "vector",
          "result": [{"metric": {}, "value": [1.7e9, "42"]}]}}  # fmt: skip


class GuardedProm:
    """Answers 42 to a request with the expected token and tenant, else 401."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.seen: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        auth_ok = request.headers.get("Authorization") == f"Bearer {self.token}"
        if not (auth_ok and request.headers.get("X-Scope-OrgID") == "team-a"):
            return web.json_response({"status": "error", "error": "unauthorized"}, status=401)
        return web.json_response(ANSWER)


async def serve(prom: GuardedProm, tls: ssl.SSLContext | None = None) -> TestServer:
    app = web.Application()
    app.router.add_get("/api/v1/query", prom.handle)
    srv = TestServer(app, host="127.0.0.1", scheme="https" if tls else "http")
    await srv.start_server(ssl=tls)
    return srv


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[GuardedProm, str]]:
    prom = GuardedProm("s3cret")
    srv = await serve(prom)
    yield prom, str(srv.make_url("")).rstrip("/")
    await srv.close()


async def query(url: str, auth: PrometheusAuth | None) -> Any:
    async with MetricsClient(url, auth=auth) as client:
        return await client.query("up")


TENANT = {"X-Scope-OrgID": "team-a"}


def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "token"
    path.write_text(token)
    return path


async def test_token_and_tenant_header_are_sent(
    guarded: tuple[GuardedProm, str], tmp_path: Path
) -> None:
    prom, url = guarded
    auth = PrometheusAuth(str(token_file(tmp_path, "s3cret\n")), headers=TENANT)
    answer = await query(url, auth)
    assert answer.reading == Reading(42.0, MetricState.OK) and not answer.error
    assert "unauthorized" in (await query(url, None)).error  # the same server, no credentials


async def test_a_rotated_token_is_read_again(
    guarded: tuple[GuardedProm, str], tmp_path: Path
) -> None:
    """Projected ServiceAccount tokens rotate: the file is read on every query."""
    prom, url = guarded
    token = token_file(tmp_path, "old")
    auth = PrometheusAuth(str(token), headers=TENANT)
    async with MetricsClient(url, auth=auth) as client:
        assert (await client.query("up")).error
        token.write_text("s3cret")
        assert (await client.query("up")).reading.ok


async def test_a_missing_token_file_is_missing_data_naming_the_file(
    guarded: tuple[GuardedProm, str], tmp_path: Path
) -> None:
    prom, url = guarded
    answer = await query(url, PrometheusAuth(str(tmp_path / "absent")))
    assert answer.reading.state is MetricState.MISSING and "bearer token" in answer.error
    assert "absent" in answer.error and not prom.seen  # nothing sent without it


async def test_https_with_a_private_ca(tmp_path: Path) -> None:
    certs = pki.generate(tmp_path / "pki")  # serving cert for 127.0.0.1, signed by ca.crt
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certs.apiserver_crt, certs.apiserver_key)
    prom = GuardedProm("s3cret")
    srv = await serve(prom, tls)
    url = str(srv.make_url("")).rstrip("/")
    assert url.startswith("https://")
    token = token_file(tmp_path, "s3cret")
    try:
        trusted = await query(url, PrometheusAuth(str(token), str(certs.ca_crt), TENANT))
        assert trusted.reading == Reading(42.0, MetricState.OK)
        untrusted = await query(url, PrometheusAuth(str(token), None, TENANT))
        assert not untrusted.reading.ok and "certificate" in untrusted.error.lower()
        no_bundle = await query(url, PrometheusAuth(str(token), str(tmp_path / "no.pem")))
        assert not no_bundle.reading.ok and "CA file" in no_bundle.error
    finally:
        await srv.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, PrometheusAuth()),
        (
            {"ROOFTOP_PROMETHEUS_BEARER_TOKEN_FILE": "/var/run/secrets/t",
             "ROOFTOP_PROMETHEUS_CA_FILE": "/etc/ca.pem",
             "ROOFTOP_PROMETHEUS_HEADERS": '{"X-Scope-OrgID": "team-a"}'},
            PrometheusAuth("/var/run/secrets/t", "/etc/ca.pem", {"X-Scope-OrgID": "team-a"}),
        ),
    ],
)  # fmt: skip
def test_auth_from_the_environment(env: dict[str, str], expected: PrometheusAuth) -> None:
    assert configured(read_settings(env)).loop.prometheus_auth == expected


@pytest.mark.parametrize("raw", ["X-Scope-OrgID=team-a", '["a"]', '{"n": 1}'])
def test_headers_must_be_a_json_object_of_strings(raw: str) -> None:
    with pytest.raises(ValueError, match="ROOFTOP_PROMETHEUS_HEADERS=.*JSON object of strings"):
        read_settings({"ROOFTOP_PROMETHEUS_HEADERS": raw})
