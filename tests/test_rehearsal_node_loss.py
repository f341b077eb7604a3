"""The node-loss phase's stream through decode's own Serve proxy (rehearsal/node_loss.py).

The phase runs in `make rehearse`; these tests pin what it relies on. The rehearsal's client
(streams.stream_chat), on a real socket, tells a stream whose proxy died mid-stream (the connection
closes, or is reset, inside a chunked body) from one the ingress ended with its error event
(the key ingress's `stream_interrupted`); and Serve, by its own schema on the
product's serve config, runs a proxy on decode's node at the address the phase calls.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rehearsal import node_loss, streams
from rehearsal.context import Context
from rehearsal.network import WORKER_IP
from serve_config import SERVE_PORT
from tests.conftest import require_serve_deps

EVENT = 'data: {"choices": [{"delta": {"content": "one"}}]}\n\n'
# The event the product's ingress ends a cut stream with (OpenAI's error shape; tests/test_endpoint_keys.py).
INTERRUPTED = 'data: {"error": {"message": "The stream was interrupted", "type": "server_error", "param": null, '
INTERRUPTED += '"code": "stream_interrupted"}}\n\n'


def _chunk(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@contextlib.contextmanager
def _serve_once(events: list[str], *, ending: str) -> Iterator[str]:
    """A one-connection HTTP server: a 200 SSE stream of `events`, then `ending`: "done" (the last
    chunk), "close" (FIN inside the body, as a killed proxy's kernel sends) or "reset" (RST)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
            while len(body) < length:
                body += connection.recv(65536)
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"".join(_chunk(e) for e in events)
            )
            if ending == "done":
                connection.sendall(_chunk("data: [DONE]\n\n") + b"0\r\n\r\n")
                return
            time.sleep(0.3)  # the client has read what was sent, and waits for more
            if ending == "reset":
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        thread.join(timeout=10)
        server.close()


def _outcome(tmp_path: Path, events: list[str], ending: str) -> streams.Outcome:
    config: dict[str, Any] = {
        "applications": [{"args": {"decode_config": {"model_loading_config": {"model_id": "m"}}}}]
    }
    with _serve_once(events, ending=ending) as url:
        ctx = Context("pd", config, {}, {}, tmp_path, tmp_path, tmp_path, None, serve=url)
        return streams.stream_chat(ctx, 8, timeout=10)


@pytest.mark.parametrize("ending", ["close", "reset"])
def test_a_stream_whose_proxy_died_is_cut_without_the_error_event(tmp_path: Path, ending: str) -> None:
    outcome = _outcome(tmp_path, [EVENT, EVENT], ending)
    assert outcome.status == 200 and outcome.chunks == 2 and not outcome.done
    # A FIN inside the chunked body reads as the body's end (http.client raises nothing), a reset as an error.
    assert (outcome.error == "") is (ending == "close")
    assert not node_loss.error_event(outcome)
    assert node_loss.cut_without_error_event(outcome)


def test_a_stream_the_ingress_ended_carries_its_error_event(tmp_path: Path) -> None:
    body = [EVENT, EVENT, INTERRUPTED]
    outcome = _outcome(tmp_path, body, "done")
    assert node_loss.error_event(outcome) and "stream_interrupted" in outcome.error
    assert outcome.kind == "error" and not node_loss.cut_without_error_event(outcome)
    # The same stream, then its proxy gone too: the event already read still counts.
    assert node_loss.error_event(_outcome(tmp_path, body, "close"))


def test_a_complete_stream_is_not_cut(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, [EVENT], "done")
    assert outcome.kind == "ok" and not node_loss.cut_without_error_event(outcome)


def test_serve_runs_a_proxy_on_decodes_node_where_the_phase_calls_it(rayservice: dict[str, Any]) -> None:
    """Ray's own schema on the product's serve config: a proxy on every node with a replica, on all
    addresses, on the serve port (decode's replica is on node B)."""
    require_serve_deps()
    from ray.serve.config import ProxyLocation
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(yaml.safe_load(rayservice["spec"]["serveConfigV2"]))
    assert schema.proxy_location == ProxyLocation.EveryNode
    assert (schema.http_options.host, schema.http_options.port) == ("0.0.0.0", SERVE_PORT)
    assert f"http://{WORKER_IP}:{SERVE_PORT}" == node_loss.NODE_B_PROXY
