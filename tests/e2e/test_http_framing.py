"""HTTP/1.1 framing under hostile and unusual requests, over raw sockets: request smuggling
(Content-Length against Transfer-Encoding), malformed lengths and chunks, refused requests with
unread bodies, Host, HTTP/1.0, HEAD, Expect: 100-continue, chunked request bodies, pipelining,
the head limits; and clean endings when the server stops under the official OpenAI client.
One rule runs through them: no request's bytes ever produce a second response."""

import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from conftest import Server

SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def srv():
    s = Server(env={"EDGELM_API_KEY": "k3y"})
    yield s
    s.stop()


def exchange(port: int, payload: bytes, linger: float = 1.0, then: bytes = b"") -> tuple[bytes, bool]:
    """Sends `payload` (and `then`, a moment later), reads until the server closes or is quiet
    for `linger` s; returns what came and whether the server closed the connection."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(payload)
        if then:
            time.sleep(0.3)
            try:
                s.sendall(then)
            except (BrokenPipeError, ConnectionResetError):
                pass
        got, closed = b"", False
        s.settimeout(linger)
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
        return got, closed
    finally:
        s.close()


def responses(data: bytes, head_only: tuple = ()) -> list:
    """Splits what a connection received into (status, headers, body) responses, by the
    framing each response declares; `head_only`: indexes of answers to HEAD (no body)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"a truncated response head: {data[:300]!r}"
        lines = head.split(b"\r\n")
        assert lines[0].startswith(b"HTTP/1."), f"not a response: {data[:300]!r}"
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode()
        if status == 100 or len(out) in head_only:
            body = b""
        elif "content-length" in headers:
            n = int(headers["content-length"])
            body, rest = rest[:n], rest[n:]
            assert len(body) == n, f"a body cut short: {body!r}"
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                body, rest = body + rest[:n], rest[n + 2:]
                if n == 0:
                    break
        else:
            body, rest = rest, b""
        out.append((status, headers, body))
        data = rest
    return out


def one_refusal(got: bytes, closed: bool, status: int):
    rs = responses(got)
    assert [r[0] for r in rs] == [status], rs
    assert closed, "the connection stays open after a framing error"
    assert json.loads(rs[0][2])["error"]["message"], rs[0]
    return rs[0]


AUTH = b"Authorization: Bearer k3y\r\n"


@pytest.mark.parametrize("route", [b"/v1/nothing", b"/v1/completions", b"/v1/models"])
@pytest.mark.parametrize("order", ["cl_first", "te_first"])
def test_content_length_with_transfer_encoding_is_one_400_and_a_close(srv, route, order):
    # The body is a chunked body that ends at once, then a whole second request: a server that
    # framed by one header and a proxy that framed by the other would read it apart.
    body = b"0\r\n\r\n" + SMUGGLED
    cl, te = b"Content-Length: %d\r\n" % len(body), b"Transfer-Encoding: chunked\r\n"
    fields = cl + te if order == "cl_first" else te + cl
    got, closed = exchange(srv.port, b"POST " + route + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + fields + b"\r\n" + body)
    one_refusal(got, closed, 400)


@pytest.mark.parametrize("fields", [
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
    b"Transfer-Encoding: chunked, identity\r\n",
    b"Transfer-Encoding: identity\r\n",
    b"Transfer-Encoding: xchunked\r\n",
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    b"Content-Length: +31\r\n",
    b"Content-Length: -1\r\n",
    b"Content-Length: 0x1f\r\n",
    b"Content-Length: 31\r\nContent-Length: 32\r\n",
    b"Content-Length: 31, 31\r\n",
    b"Content-Length: 1 1\r\n",
    b"Content-Length: 99999999999999999999999\r\n",
    b"X-Folded: a\r\n b\r\n",
    b"X-Bare: a\rb\r\n",
    b"Bad Name: a\r\n",
])
def test_framing_a_peer_could_read_apart_is_one_400_and_a_close(srv, fields):
    body = b'{"prompt": "x", "max_tokens": 1}'
    got, closed = exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + fields + b"\r\n"
                           + body + SMUGGLED)
    one_refusal(got, closed, 400)


@pytest.mark.parametrize("chunks", [
    b"zz\r\nabc\r\n0\r\n\r\n",
    b"3\r\nabcdef\r\n0\r\n\r\n",
    b"-3\r\nabc\r\n0\r\n\r\n",
    b"ffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
])
def test_an_invalid_chunk_is_one_400_and_a_close(srv, chunks):
    got, closed = exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH
                           + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + SMUGGLED)
    one_refusal(got, closed, 400)


def test_a_chunked_request_body_is_read(srv):
    body = json.dumps({"prompt": "The sea is", "max_tokens": 4}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:5], body[5:])) + b"0\r\n\r\n"
    got, _ = exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH
                      + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    rs = responses(got)
    assert [r[0] for r in rs] == [200], rs
    assert json.loads(rs[0][2])["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("head", [
    b"POST /v1/nothing HTTP/1.1\r\nHost: x\r\n" + AUTH,
    b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH,
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
])
def test_a_refused_request_never_leaves_its_body_to_be_read_as_a_request(srv, head):
    # The body is a request of its own: it must not be answered, whether the connection
    # stays open (the body skipped) or closes.
    got, _ = exchange(srv.port, head + b"Content-Length: %d\r\n\r\n" % len(SMUGGLED) + SMUGGLED)
    rs = responses(got)
    assert len(rs) == 1 and rs[0][0] in (404, 405, 401), rs
    # Sent after the answer, unread: still never a request.
    got, _ = exchange(srv.port, head + b"Content-Length: %d\r\n\r\n" % len(SMUGGLED), then=SMUGGLED)
    rs = responses(got)
    assert len(rs) == 1 and rs[0][0] in (404, 405, 401), rs


def test_pipelined_requests_are_answered_in_order(srv):
    got, closed = exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"
                           b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", linger=0.5)
    rs = responses(got)
    assert [r[0] for r in rs] == [200, 200, 404], rs
    assert json.loads(rs[1][2])["object"] == "list"
    assert not closed


def test_host_is_required_on_http_1_1_and_not_on_1_0(srv):
    got, closed = exchange(srv.port, b"GET /health HTTP/1.1\r\n\r\n")
    one_refusal(got, closed, 400)
    got, closed = exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    one_refusal(got, closed, 400)
    got, closed = exchange(srv.port, b"GET /health HTTP/1.0\r\n\r\n")
    assert [r[0] for r in responses(got)] == [200] and closed, got


def test_http_1_0_gets_no_chunked_answer_and_keeps_alive_only_when_asked(srv):
    body = json.dumps({"prompt": "Hi", "max_tokens": 3, "stream": True}).encode()
    got, closed = exchange(srv.port, b"POST /v1/completions HTTP/1.0\r\n" + AUTH
                           + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0], head
    assert b"chunked" not in head.lower(), head
    assert rest.rstrip().endswith(b"data: [DONE]") and closed, rest[-200:]
    # keep-alive asked for: two answers on one connection, each with its length.
    two = b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2
    got, closed = exchange(srv.port, two, linger=0.5)
    rs = responses(got)
    assert [r[0] for r in rs] == [200, 200] and not closed, rs
    assert rs[0][1].get("connection", "").lower() == "keep-alive", rs[0][1]


def test_head_gets_no_body_on_every_get_route(srv):
    for route in (b"/health", b"/v1/models", b"/metrics", b"/"):
        got, closed = exchange(srv.port, b"HEAD " + route + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"
                               b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", linger=0.5)
        rs = responses(got, head_only=(0,))
        assert [r[0] for r in rs] == [200, 200], (route, rs)
        assert rs[1][2] == b'{"status":"ready"}', (route, rs)


def test_expect_100_continue(srv):
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n"
    # Read: 100 first, then the answer once the body comes.
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(head % len(body))
    assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue"), "no 100 Continue"
    s.sendall(body)
    got = b""
    while b'"usage"' not in got:
        got += s.recv(65536)
    s.close()
    assert got.startswith(b"HTTP/1.1 200"), got
    # Refused from the head: no 100, the refusal, and the connection closes.
    for refused, status in ((b"POST /v1/nothing HTTP/1.1\r\nHost: x\r\n" + AUTH, 404),
                            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 401),
                            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH, 413)):
        length = 99_999_999 if status == 413 else len(body)
        got, closed = exchange(srv.port, refused + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % length)
        rs = responses(got)
        assert [r[0] for r in rs] == [status] and closed, rs


def test_head_limits_give_431_and_414(srv):
    many = b"".join(b"X-%d: y\r\n" % i for i in range(65))
    got, closed = exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    one_refusal(got, closed, 431)
    got, closed = exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 20_000 + b"\r\n\r\n")
    one_refusal(got, closed, 431)
    for n in (9_000, 100_000):
        got, closed = exchange(srv.port, b"GET /" + b"a" * n + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        one_refusal(got, closed, 414)


def test_the_bearer_scheme_is_matched_in_any_case(srv):
    for scheme in ("Bearer", "bearer", "BEARER"):
        r = httpx.get(srv.base + "/v1/models", headers={"Authorization": f"{scheme} k3y"})
        assert r.status_code == 200, (scheme, r.text)
    assert httpx.get(srv.base + "/v1/models", headers={"Authorization": "Bearer K3Y"}).status_code == 401


def test_garbage_never_gets_more_answers_than_it_has_heads(srv):
    """Assorted hostile byte streams: each answer is whole, and there are never more answers
    than request heads the bytes could hold."""
    cases = [
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 10\r\n\r\n" + SMUGGLED,
        b"\r\n\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\nHost: x\n\n",
        b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n",
        b"GET  /health  HTTP/1.1\r\nHost: x\r\n\r\n",
        b"G\x00T /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n0\r\n\r\n" + SMUGGLED,
    ]
    for raw in cases:
        got, _ = exchange(srv.port, raw, linger=0.5)
        rs = responses(got)
        assert len(rs) <= max(1, raw.count(b" HTTP/")), (raw, rs)


def test_sigterm_ends_every_answer_in_a_form_the_openai_client_parses():
    """SIGTERM with a 1 s drain during 8 streaming and 8 non-streaming answers that would each
    outlast it: every client ends with a complete answer or an error it can parse (a stream's
    error event, or an error response), none with a connection error."""
    srv = Server("--drain-seconds", "1", "--max-seqs", "16")
    outcomes = [None] * 16
    started = threading.Barrier(17)

    def client(i: int):
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=60)
        args = dict(model="m", prompt=f"Story {i}:", max_tokens=2000, extra_body={"ignore_eos": True})
        try:
            if i % 2:
                stream = c.completions.create(stream=True, **args)
                started.wait()
                text = "".join(ch.choices[0].text for ch in stream if ch.choices)
                outcomes[i] = ("complete", text)
            else:
                started.wait()
                r = c.completions.create(**args)
                outcomes[i] = ("complete", r.choices[0].text)
        except openai.APIConnectionError as e:
            outcomes[i] = ("connection error", repr(e))
        except openai.APIError as e:
            outcomes[i] = ("error", str(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    try:
        for t in threads:
            t.start()
        started.wait()
        time.sleep(1.5)  # every request admitted and generating
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        rc = srv.proc.wait(timeout=30)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
        srv.log.close()
    kinds = [o[0] if o else "no outcome" for o in outcomes]
    print(f"\noutcomes after SIGTERM: {kinds}")
    assert rc == 0
    assert all(k in ("complete", "error") for k in kinds), outcomes
    # They would each take far longer than the drain: they were ended, with an error.
    assert kinds.count("error") >= 14, outcomes


def test_a_body_that_stops_coming_is_closed_by_the_body_timeout(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("[server]\nbody_timeout_s = 1\n")
    s = Server("--config", str(profile))
    try:
        t0 = time.time()
        got, closed = exchange(s.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
                               linger=5)
        took = time.time() - t0
        assert got == b"" and closed and 0.8 < took < 3, (got, closed, took)
        m = httpx.get(s.base + "/metrics").text
        assert 'edgelm_http_timeouts_total{phase="body"} 1' in m, m
    finally:
        s.stop()
