"""Abusive clients: 429 floods (driven by autocannon, a third-party load tool), slow and
half-sent connections, the connection cap, the per-client token bucket, refusals before the
body. Figures are printed; the bench with longer runs is scripts/abuse-bench.sh."""

import json
import re
import resource
import select
import socket
import subprocess
import threading
import time

import httpx
import pytest

from conftest import ROOT, Server

AUTOCANNON = ROOT / "target" / "node" / "node_modules" / ".bin" / "autocannon"
BODY = json.dumps({"prompt": "Count from one to a hundred:", "max_tokens": 64, "ignore_eos": True})


def labeled(srv: Server, name: str) -> dict:
    """{labels: value} of one metric family with labels, e.g. {'phase="header"': 3.0}."""
    text = httpx.get(srv.base + "/metrics", timeout=5).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M)}


def autocannon(srv: Server, connections: int, seconds: int) -> dict:
    """autocannon's JSON report of a closed loop: every connection resends as soon as it has
    an answer, whatever its status (so a refused one comes straight back: the flood)."""
    assert AUTOCANNON.exists(), (
        f"{AUTOCANNON} is missing: npm install --prefix target/node autocannon@9 (.ci/run does)")
    r = subprocess.run([str(AUTOCANNON), "-j", "-c", str(connections), "-d", str(seconds), "-t", "60",
                        "-m", "POST", "-H", "Content-Type=application/json", "-b", BODY,
                        srv.base + "/v1/completions"], capture_output=True, text=True, timeout=seconds + 120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def ttfts(log_text: str) -> list:
    """Times to first token of the requests the server logged (every one admitted that got a
    first token; those cut off when the load tool stopped included)."""
    return [float(t) for t in re.findall(r"cmpl-\d+: .* ttft=([0-9.]+)s", log_text)]


def p99(xs: list) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def run_phase(srv: Server, connections: int, seconds: int, warmup_s: float = 0.0) -> dict:
    """One autocannon run; goodput (generated tokens a second, from /metrics) and the TTFT
    of the requests that arrived after `warmup_s` (the server's log lines)."""
    log = open(srv.log.name)
    log.seek(0, 2)
    m0 = srv.metrics()
    t0 = time.time()
    result = {}
    runner = threading.Thread(target=lambda: result.update(autocannon(srv, connections, seconds)))
    runner.start()
    mark = None
    if warmup_s:
        time.sleep(warmup_s)
        log.read()  # requests answered so far are the warm-up's
        mark = srv.metrics()
    runner.join()
    m1 = srv.metrics()
    begin, span = (mark, seconds - warmup_s) if mark else (m0, time.time() - t0)
    srv.wait_idle(timeout=30)
    codes = {k: v["count"] for k, v in result.get("statusCodeStats", {}).items()}
    return {
        "goodput": (m1["edgelm_generation_tokens_total"] - begin["edgelm_generation_tokens_total"]) / span,
        "ttft": ttfts(log.read()),
        "codes": codes,
        "errors": result["errors"],
        "timeouts": result["timeouts"],
        "requests": result["requests"]["total"],
    }


def test_a_429_flood_keeps_the_goodput_of_polite_clients():
    srv = Server()
    try:
        polite = run_phase(srv, 16, 20)
        # 256 connections, every refused one straight back. The first burst fills the running
        # batch and the queue (it cannot be told from a burst of polite clients yet) until the
        # flood shows and the queued requests are shed; the figures leave its first seconds out.
        flood = run_phase(srv, 256, 23, warmup_s=3)
        ratio = flood["goodput"] / polite["goodput"]
        assert polite["ttft"] and flood["ttft"], ("no request got a first token", polite, flood)
        pp, fp = p99(polite["ttft"]), p99(flood["ttft"])
        print(f"\npolite 16: {polite['goodput']:.0f} tok/s, TTFT p99 {pp * 1e3:.0f} ms, {polite['codes']}")
        print(f"flood 256: {flood['goodput']:.0f} tok/s ({ratio:.2f}x), TTFT p99 {fp * 1e3:.0f} ms "
              f"over {len(flood['ttft'])} admitted, {flood['codes']}, errors {flood['errors']} timeouts {flood['timeouts']}")
        rejected = labeled(srv, "edgelm_http_rejected_total")
        print(f"front refusals: {rejected}")
        # (On a loaded 2-core runner a request of 64 tokens beside 15 others can outlast the run.)
        assert set(polite["codes"]) <= {"200"} and polite["timeouts"] == 0, polite
        assert flood["timeouts"] == 0 and flood["errors"] == 0, flood
        assert set(flood["codes"]) <= {"200", "429"} and flood["codes"].get("429", 0) > 100, flood
        assert rejected['reason="overloaded"'] > 100, rejected
        assert ratio >= 0.8, (polite["goodput"], flood["goodput"])
        assert fp <= 2 * pp, (pp, fp)
        srv.wait_idle()
    finally:
        srv.stop()


def test_slow_connections_are_bounded_and_closed_by_the_header_timeout():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    srv = Server("--header-timeout", "3")
    socks = []
    try:
        t0 = time.time()
        for _ in range(2000):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            socks.append(s)
        opened = time.time() - t0
        t1 = time.perf_counter()
        r = httpx.post(srv.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=10)
        took = time.perf_counter() - t1
        m = srv.metrics()
        held = m["edgelm_http_connections_open"]
        print(f"\n2,000 half-sent heads opened in {opened:.2f} s; a normal request took {took * 1e3:.0f} ms; "
              f"{held:.0f} connections held, {m['process_threads']:.0f} threads, {m['process_open_fds']:.0f} fds")
        assert r.status_code == 200 and took < 1.0, (r.status_code, took)
        assert held >= 2000, held
        assert m["process_threads"] <= 400, m["process_threads"]
        # Every half-sent one is closed by the header timeout (3 s after it was accepted).
        deadline = t0 + 3 + 3
        for s in socks:
            s.settimeout(max(0.05, deadline - time.time()))
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        closed_after = time.time() - t0
        timeouts = labeled(srv, "edgelm_http_timeouts_total")
        print(f"all closed {closed_after:.1f} s after the first was opened; timeouts {timeouts}")
        assert timeouts['phase="header"'] >= 2000, timeouts
        assert srv.metrics()["edgelm_http_connections_open"] <= 1
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_connections_beyond_the_cap_are_closed_at_once():
    cap, over = 50, 5
    srv = Server("--max-connections", str(cap))
    socks = []
    try:
        # Which connections are refused depends on when the front takes them off the backlog
        # (the readiness probe's own connection may still count for a moment), so the test
        # holds the property, not an order: of cap + over connections, at most cap stay open
        # and every other one is answered 503 (or closed) at once, well before the 10 s
        # header timeout would close a held one.
        for _ in range(cap + over):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        refused, deadline = [], time.time() + 3
        waiting = list(socks)
        while len(refused) < over and (left := deadline - time.time()) > 0:
            readable, _, _ = select.select(waiting, [], [], left)
            for s in readable:
                waiting.remove(s)
                got = b""
                try:
                    while chunk := s.recv(4096):
                        got += chunk
                except ConnectionResetError:
                    pass
                refused.append(got)
        assert len(waiting) <= cap, f"{len(waiting)} connections held under a cap of {cap}"
        assert len(refused) >= over, len(refused)
        assert all(got == b"" or got.startswith(b"HTTP/1.1 503") for got in refused), refused
        for s in socks:
            s.close()
        socks = []
        time.sleep(0.3)
        assert labeled(srv, "edgelm_http_connections_rejected_total")['reason="cap"'] >= over
        assert httpx.post(srv.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_one_client_over_its_rate_gets_429_with_retry_after():
    srv = Server("--client-rate", "1", "--client-burst", "2")
    try:
        statuses = []
        with httpx.Client(base_url=srv.base, timeout=30) as c:
            for _ in range(4):
                r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
                statuses.append(r.status_code)
                if r.status_code == 429:
                    assert int(r.headers["retry-after"]) >= 1
                    assert r.json()["error"]["code"] == "client_rate_limited"
            # Other endpoints are not metered.
            assert c.get("/v1/models").status_code == 200
        assert statuses[:2] == [200, 200] and 429 in statuses[2:], statuses
        assert labeled(srv, "edgelm_http_rejected_total")['reason="client_rate"'] >= 1
        time.sleep(1.1)
        assert httpx.post(srv.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200
    finally:
        srv.stop()


def test_a_refused_request_is_answered_before_its_body_is_sent():
    srv = Server("--max-seqs", "1", "--max-queue", "0")
    busy = None
    try:
        busy = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        body = b'{"prompt": "Story:", "max_tokens": 300, "ignore_eos": true, "stream": true}'
        busy.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data: {" not in got:
            got += busy.recv(4096)
        # A head that declares a large body and sends none of it: the answer comes at once.
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        t0 = time.perf_counter()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n")
        answer = s.recv(4096)
        took = time.perf_counter() - t0
        s.close()
        assert answer.startswith(b"HTTP/1.1 429") and b"Retry-After:" in answer, answer
        assert took < 0.5, took
        # Unknown paths, missing keys and oversized bodies likewise need no body.
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        s.sendall(b"POST /v1/nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 404")
        s.close()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 413")
        s.close()
    finally:
        if busy:
            busy.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            busy.close()
        srv.stop()


def test_kept_alive_connections_carry_several_answers_and_time_out_when_idle(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("[server]\nidle_timeout_s = 1\n")
    srv = Server("--config", str(profile))
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        for _ in range(3):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200") and b"close" not in got.lower(), got
        # HEAD: the head only, so the next answer on the connection starts clean.
        s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while got.count(b"HTTP/1.1 200") < 2 or not got.endswith(b"}"):
            got += s.recv(4096)
        first, second = got.split(b"HTTP/1.1 200")[1:]
        assert first.endswith(b"\r\n\r\n") and second.endswith(b'{"status":"ready"}'), got
        t0 = time.time()
        assert s.recv(1) == b""
        assert 0.8 < time.time() - t0 < 2.5
        assert labeled(srv, "edgelm_http_timeouts_total")['phase="idle"'] >= 1
    finally:
        srv.stop()
