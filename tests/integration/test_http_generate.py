"""Triton's generate extension over HTTP (issue 27, item 3): `generate` and `generate_stream`
against the session server's example models, with the standard library's HTTP client: the
decoupled `generate` python model streams its tokens as Server-Sent Events, `simple` (not
decoupled) answers one event, and errors come as Triton writes them."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from tests.integration.conftest import ServerProcess


@pytest.fixture(scope="module")
def http_url(server: ServerProcess) -> str:
    assert server.http_url, "the server logged no http_port"
    return server.http_url


def post(url: str, path: str, body: Any) -> tuple[int, dict[str, str], bytes]:
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        connection.close()


def events(body: bytes) -> list[dict[str, Any]]:
    """The data of each Server-Sent Event, in order."""
    found = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            found.append(json.loads(block[len("data: ") :]))
    return found


def test_generate_stream_sends_each_token_as_an_event(http_url: str) -> None:
    status, headers, body = post(
        http_url,
        "/v2/models/generate/generate_stream",
        {"PROMPT": "the quick brown fox", "MAX_TOKENS": 6},
    )
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    tokens = [event["TOKEN"] for event in events(body)]
    assert tokens == ["the", "quick", "brown", "fox", "the", "quick"]
    assert all(e["model_name"] == "generate" and e["model_version"] == "1" for e in events(body))


def test_generate_answers_one_json_object(http_url: str) -> None:
    status, headers, body = post(
        http_url, "/v2/models/generate/generate", {"PROMPT": "hello world", "MAX_TOKENS": 5}
    )
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"model_name": "generate", "model_version": "1", "TOKEN": "hello"}


def test_generate_on_a_model_that_is_not_decoupled(http_url: str) -> None:
    a, b = list(range(16)), [1] * 16
    status, _, body = post(http_url, "/v2/models/simple/generate", {"INPUT0": a, "INPUT1": b})
    assert status == 200
    answer = json.loads(body)
    assert answer["OUTPUT0"] == [x + 1 for x in a]
    assert answer["OUTPUT1"] == [x - 1 for x in a]
    # Streamed: the one answer is one event.
    status, _, body = post(
        http_url, "/v2/models/simple/generate_stream", {"INPUT0": a, "INPUT1": b}
    )
    assert status == 200
    assert [e["OUTPUT0"] for e in events(body)] == [[x + 1 for x in a]]


def test_generate_errors_are_triton_json_errors(http_url: str) -> None:
    # Refused before anything runs: a JSON error with its status, not an event stream.
    status, headers, body = post(http_url, "/v2/models/simple/generate_stream", {"INPUT0": [1]})
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert "INPUT0" in json.loads(body)["error"]
    status, _, body = post(http_url, "/v2/models/nope/generate", {"PROMPT": "x"})
    assert status == 404
    assert "nope" in json.loads(body)["error"]
    # A parameter must be a string, number or bool.
    status, _, body = post(
        http_url,
        "/v2/models/generate/generate",
        {"PROMPT": "x", "MAX_TOKENS": 1, "parameters": {"nested": {"a": 1}}},
    )
    assert status == 400
    assert "parameter 'nested'" in json.loads(body)["error"]
