"""The disconnects phase's clients: half of them send what lets a stream outlive the drain at Serve's proxy.

The phase's idle check proves the engines stop for those streams only if Serve's proxy really reads
the headers as "no timeout" and "no cancel on a hang-up": Ray 2.58's own parsers decide here
(serve/_private/http_util.py, as proxy.py calls them on the request's headers).
"""

from __future__ import annotations

import pytest

from rehearsal import disconnects
from tests.conftest import require_serve_deps

pytestmark = pytest.mark.private_internals

AUTH = {"Content-Type": "application/json", "Authorization": "Bearer sk-test"}


@pytest.mark.serve
def test_half_the_clients_turn_off_the_proxys_timeout_and_hang_up_cancel() -> None:
    require_serve_deps()
    from ray.serve._private.http_util import parse_disconnect_disabled_header, parse_request_timeout_header

    sent = disconnects.client_headers(AUTH)
    assert len(sent) == disconnects.STREAMS
    # What the proxy sees: ASGI headers, lower-case bytes.
    parsed = [{k.lower().encode(): v.encode() for k, v in headers.items()} for headers in sent]
    outlive = [
        h for h in parsed if parse_request_timeout_header(h, 600.0) is None and parse_disconnect_disabled_header(h)
    ]
    plain = [
        h for h in parsed if parse_request_timeout_header(h, 600.0) == 600.0 and not parse_disconnect_disabled_header(h)
    ]
    assert len(outlive) == disconnects.WITH_HEADERS == disconnects.STREAMS // 2
    assert len(plain) == disconnects.STREAMS - disconnects.WITH_HEADERS
    # Every client still sends the run's key: the phase runs with keys on, and a 401 would prove nothing.
    assert all(AUTH.items() <= headers.items() for headers in sent)
    # Interleaved: the two kinds start, hold and hang up together.
    assert [disconnects.OUTLIVE_THE_DRAIN.items() <= h.items() for h in sent[:4]] == [False, True, False, True]
