"""Faults: KV exhaustion, clients vanishing at every stage, SIGTERM under load, SIGKILL and an
immediate restart, broken model files, bad profiles, logs to a full disk, a taken port. Each
server started here ends idle and is stopped; no process outlives its test."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import ARTIFACTS, BINARY, MODEL, Server, free_port

LINGER_RST = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends a RST


class FaultServer(Server):
    """conftest's Server with the fault tests' helpers."""

    def cancelled(self) -> float:
        """Requests whose client went away (queued, prefilling or decoding)."""
        text = httpx.get(self.base + "/metrics", timeout=5).text
        m = re.search(r'^edgelm_request_errors_total\{reason="cancelled"\} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    def complete(self, prompt: str, max_tokens: int = 12, **extra) -> dict:
        r = httpx.post(self.base + "/v1/completions", timeout=120, json={
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self):
        if self.proc.poll() is None:
            super().stop()
        elif not self.log.closed:
            self.log.close()


def wait_for(cond, timeout: float, what: str, step: float = 0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def post_raw(port: int, body: dict) -> socket.socket:
    """Sends a /v1/completions request on a raw socket, so the test decides when it closes."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def read_until(s: socket.socket, marker: bytes, got: bytes = b"", timeout: float = 60) -> bytes:
    deadline = time.time() + timeout
    while marker not in got:
        assert time.time() < deadline, f"no {marker!r} after {timeout} s: {got[-300:]!r}"
        chunk = s.recv(65536)
        assert chunk, f"connection closed before {marker!r}: {got[-300:]!r}"
        got += chunk
    return got


def sse_events(raw: bytes) -> list:
    """The `data:` payloads of a chunked SSE response read off a raw socket."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    text = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        text += rest[:n]
        body = rest[n + 2:]
    return [line[6:].decode() for line in text.split(b"\n") if line.startswith(b"data: ")]


def stream_text(events: list) -> tuple[str, str | None]:
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    return text, finish[-1] if finish else None


def one_error_line(stderr: str) -> str:
    assert "panicked" not in stderr and "RUST_BACKTRACE" not in stderr and "stack backtrace" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def run_serve(*args: str, timeout: float = 15) -> tuple[subprocess.CompletedProcess, float]:
    """`edgelm serve ARGS` expected to fail fast; a server that comes up instead is killed."""
    t0 = time.time()
    try:
        r = subprocess.run([str(BINARY), "serve", *args], capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "RUST_BACKTRACE": "1"})
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"`edgelm serve {' '.join(args)}` still running after {timeout} s: {e.stderr!r}")
    return r, time.time() - t0


# 1. KV exhaustion -------------------------------------------------------------------------------

PROMPTS = [
    "The capital of France is", "My favourite colour is", "Once upon a time, a dragon",
    "def fibonacci(n):", "The three laws of robotics are", "Water boils at",
    "Dear Sir or Madam,", "In 1969, the first man on the moon", "A haiku about autumn:",
    "The recipe for pancakes needs", "To be or not to be,", "The quick brown fox",
]


def test_kv_exhaustion_preempts_and_recomputes_without_changing_output():
    # 2 MiB of f16 pages: 5 blocks of 16 tokens. Each request (a few prompt tokens + 32) needs
    # 3 blocks, so one fits alone and twelve at once must preempt each other.
    srv = FaultServer("--kv-memory-mib", "2")
    try:
        m0 = srv.metrics()
        assert m0["edgelm_kv_pool_blocks"] == 5, m0
        results: dict[str, httpx.Response] = {}

        def go(p):
            results[p] = httpx.post(srv.base + "/v1/completions", timeout=120, json={
                "prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True})

        threads = [threading.Thread(target=go, args=(p,)) for p in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert srv.proc.poll() is None, "the server died under KV pressure"
        m = srv.metrics()
        assert m["edgelm_preemptions_total"] > 0, m
        concurrent = {}
        for p in PROMPTS:
            r = results[p]
            assert r.status_code == 200, (p, r.status_code, r.text)
            body = r.json()
            (choice,) = body["choices"]
            assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 32, body
            assert choice["text"], body
            concurrent[p] = choice["text"]
        srv.wait_idle()
        # The same requests one at a time (never preempted): recompute changed nothing.
        for p in PROMPTS:
            alone = srv.complete(p, 32, ignore_eos=True)["choices"][0]["text"]
            assert concurrent[p] == alone, (p, concurrent[p], alone)
        assert srv.metrics()["edgelm_preemptions_total"] == m["edgelm_preemptions_total"]
        srv.wait_idle()
    finally:
        srv.stop()
    assert srv.proc.returncode == 0


# 2. Clients that disconnect: queued, prefilling, decoding -------------------------------------

@pytest.fixture(scope="module")
def single():
    """One sequence at a time, so a second request queues."""
    srv = FaultServer("--max-seqs", "1")
    yield srv
    srv.stop()
    assert srv.proc.returncode == 0


def after_disconnect(srv: FaultServer, cancelled_before: float, within: float = 3.0):
    t0 = time.time()
    srv.wait_idle(timeout=within)
    print(f"idle {time.time() - t0:.3f} s after the client left")
    assert srv.cancelled() == cancelled_before + 1
    fresh = srv.complete("Hello", 4, ignore_eos=True)
    assert fresh["usage"]["completion_tokens"] == 4 and fresh["choices"][0]["finish_reason"] == "length", fresh
    srv.wait_idle()


def test_client_gone_while_queued(single):
    srv = single
    c0 = srv.cancelled()
    g0 = srv.metrics()["edgelm_generation_tokens_total"]
    long = post_raw(srv.port, {"prompt": "Count to a thousand:", "max_tokens": 200, "ignore_eos": True,
                               "temperature": 0, "stream": True})
    try:
        got = read_until(long, b"data: {")  # decoding: it holds the one running slot
        queued = post_raw(srv.port, {"prompt": "I wait my turn.", "max_tokens": 50})
        wait_for(lambda: srv.metrics()["edgelm_requests_waiting"] == 1, 10, "the second request to queue")
        m = srv.metrics()
        assert m["edgelm_requests_running"] == 1, m
        queued.close()
        # Noticed by the 250 ms whitespace heartbeat, dropped from the queue while the long
        # request is still decoding.
        wait_for(lambda: srv.metrics()["edgelm_requests_waiting"] == 0, 3, "the queued request to go")
        assert srv.cancelled() == c0 + 1
        m = srv.metrics()
        assert m["edgelm_requests_running"] == 1, "the long request should still be decoding"
        # The request ahead of it was not disturbed.
        text, finish = stream_text(sse_events(read_until(long, b"0\r\n\r\n", got)))
        assert finish == "length" and text
    finally:
        long.close()
    after_disconnect(srv, c0)
    # Only the long request and after_disconnect's generated: the queued one never ran.
    assert srv.metrics()["edgelm_generation_tokens_total"] == g0 + 200 + 4


def test_client_gone_while_prefilling(single):
    srv = single
    prompt = "The history of the world is long. " * 190  # about 1,500 tokens: 3 prefill chunks
    c0 = srv.cancelled()
    g0 = srv.metrics()["edgelm_generation_tokens_total"]
    # Not streamed: the answer's whitespace heartbeat (every 250 ms) notices the reset socket.
    s = post_raw(srv.port, {"prompt": prompt, "max_tokens": 50})
    try:
        wait_for(lambda: srv.metrics()["edgelm_requests_running"] == 1, 10, "the prompt to be admitted")
        s.settimeout(0.05)
        try:
            got = s.recv(65536)
        except socket.timeout:
            got = b""
        m = srv.metrics()
        assert m["edgelm_generation_tokens_total"] == g0 and b"choices" not in got, "no token should be out yet"
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
    finally:
        s.close()
    # A prefill chunk already running (512 tokens: about a second here, a few on a loaded 2-core
    # runner) finishes before the engine sees the cancel.
    after_disconnect(srv, c0, within=10.0)
    # Cut during its prefill: it never produced a token (the 4 are after_disconnect's request).
    assert srv.metrics()["edgelm_generation_tokens_total"] == g0 + 4


def test_client_gone_while_decoding(single):
    srv = single
    c0 = srv.cancelled()
    g0 = srv.metrics()["edgelm_generation_tokens_total"]
    s = post_raw(srv.port, {"prompt": "Tell me a very long story.", "max_tokens": 400, "ignore_eos": True,
                            "stream": True})
    try:
        got = b""
        while got.count(b"data: {") < 3:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert srv.metrics()["edgelm_requests_running"] == 1
    finally:
        s.close()  # an ordinary close (FIN): the next writes fail
    after_disconnect(srv, c0)
    assert srv.metrics()["edgelm_generation_tokens_total"] - g0 < 100, "the stream kept decoding"


# 3. SIGTERM under load ------------------------------------------------------------------------

def test_sigterm_drains_in_flight_streams_and_refuses_new_work():
    srv = FaultServer("--drain-seconds", "20")
    try:
        expected = srv.complete("Write a poem about the sea.", 48, ignore_eos=True)["choices"][0]["text"]
        srv.wait_idle()
        socks = [post_raw(srv.port, {"prompt": "Write a poem about the sea.", "max_tokens": 48, "temperature": 0,
                                     "ignore_eos": True, "stream": True}) for _ in range(4)]
        got = [read_until(s, b"data: {") for s in socks]
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # the drain flag is polled every 50 ms
        refused = []
        for _ in range(3):
            try:
                r = httpx.post(srv.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=10)
                assert r.status_code == 503, (r.status_code, r.text)
                assert r.json()["error"]["message"], r.text
                refused.append(503)
            except httpx.TransportError:
                refused.append("connection refused")
        try:
            health = httpx.get(srv.base + "/health", timeout=5)
            assert health.status_code == 503 and health.json()["status"] == "draining"
        except httpx.TransportError:
            pass
        for s, g in zip(socks, got):
            text, finish = stream_text(sse_events(read_until(s, b"0\r\n\r\n", g)))
            assert finish == "length" and text == expected, (text, expected)
            s.close()
        rc = srv.proc.wait(timeout=20)
        took = time.time() - t0
        print(f"drained 4 streams and exited {rc} in {took:.2f} s; new requests: {refused}")
        assert rc == 0 and took < 20
    finally:
        srv.stop()


def test_sigterm_drain_is_bounded_by_drain_seconds():
    """A request that would outlast the drain is cut when it ends, with an error event and
    [DONE] (its client can tell it was cut); the process exits 0 then (under systemd it would
    otherwise be SIGKILLed at TimeoutStopSec)."""
    srv = FaultServer("--drain-seconds", "2")
    s = post_raw(srv.port, {"prompt": "Go on forever:", "max_tokens": 3000, "ignore_eos": True, "stream": True})
    try:
        got = read_until(s, b"data: {")
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=30)
        took = time.time() - t0
        print(f"exited {rc} {took:.2f} s after SIGTERM with a 3000-token stream in flight")
        assert rc == 0 and 1.5 < took < 5, (rc, took)
        s.settimeout(5)
        while chunk := s.recv(65536):
            got += chunk
        events = sse_events(got)
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2]), events[-3:]
        assert all(json.loads(e).get("choices", [{}])[0].get("finish_reason") is None
                   for e in events[:-2]), "the stream was not cut: the drain waited for it"
    finally:
        s.close()
        srv.stop()


def test_second_sigint_exits_at_once():
    """Ctrl-C starts the drain; a second Ctrl-C is someone who wants out now: exit 1 at once."""
    srv = FaultServer("--drain-seconds", "30")
    s = post_raw(srv.port, {"prompt": "Go on forever:", "max_tokens": 3000, "ignore_eos": True, "stream": True})
    try:
        read_until(s, b"data: {")
        srv.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert srv.proc.poll() is None, "the first SIGINT must drain, not exit"
        t0 = time.time()
        srv.proc.send_signal(signal.SIGINT)
        rc = srv.proc.wait(timeout=10)
        took = time.time() - t0
        print(f"second SIGINT: exit {rc} after {took:.2f} s")
        assert rc == 1 and took < 2, (rc, took)
    finally:
        s.close()
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
        srv.log.close()


# 4. SIGKILL, then a restart on the same port --------------------------------------------------

def test_sigterm_while_starting_up_exits_promptly():
    # systemd may stop the unit while the model is still loading: the load cannot be cut short,
    # but the engine it starts must be stopped too (it once kept the process alive for good).
    for delay in (0.0, 0.02, 0.05, 0.1, 0.3):
        port = free_port()
        proc = subprocess.Popen([str(BINARY), "serve", "-m", str(MODEL), "--port", str(port), "-t", "2",
                                 "--kv-memory-mib", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"SIGTERM {delay} s after start: still running 15 s later")
        # Before the handler is installed the default action ends it (-SIGTERM); after, a drain.
        assert rc in (0, -signal.SIGTERM), (delay, rc)


def test_sigkill_then_immediate_restart_on_the_same_port():
    srv = FaultServer()
    port = srv.port
    socks = []
    try:
        before = srv.complete("The best thing about mornings is", 16)["choices"][0]["text"]
        socks = [post_raw(port, {"prompt": f"Story {i}:", "max_tokens": 300, "ignore_eos": True, "stream": True})
                 for i in range(4)]
        for s in socks:
            read_until(s, b"data: {")
        busy = srv.metrics()
        assert busy["edgelm_requests_running"] == 4 and busy["edgelm_kv_blocks_used"] > 0, busy
        srv.proc.kill()
        assert srv.proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        srv.stop()
        for s in socks:
            s.close()
    t0 = time.time()
    again = FaultServer(port=port)  # raises if the bind fails or it does not come up
    try:
        print(f"restarted on port {port} in {time.time() - t0:.2f} s")
        m = again.metrics()
        for k in ("edgelm_kv_blocks_used", "edgelm_kv_blocks_cached", "edgelm_requests_running",
                  "edgelm_requests_waiting", "edgelm_requests_finished_total", "edgelm_prompt_tokens_total"):
            assert m[k] == 0, (k, m)
        assert again.complete("The best thing about mornings is", 16)["choices"][0]["text"] == before
        again.wait_idle()
    finally:
        again.stop()
    assert again.proc.returncode == 0


# 5. Model file faults --------------------------------------------------------------------------

def broken_model(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.gguf"
    size = MODEL.stat().st_size
    if kind == "truncated":
        with open(MODEL, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read(size // 2))
    elif kind == "garbage":
        path.write_bytes(os.urandom(size))
    elif kind == "empty":
        path.write_bytes(b"")
    return path  # "missing": never created


@pytest.mark.parametrize("kind,problem", [
    ("truncated", r"past the end of the file|truncated"),
    ("garbage", r"not a GGUF file"),
    ("empty", r"truncated|empty"),
    ("missing", r"does not exist"),
])
def test_broken_model_file_fails_fast_with_one_clear_line(kind, problem, tmp_path):
    path = broken_model(kind, tmp_path)
    r, took = run_serve("-m", str(path), "--port", str(free_port()), "-t", "2", "--kv-memory-mib", "16")
    line = one_error_line(r.stderr)
    print(f"{kind}: exit {r.returncode} in {took:.2f} s: {line}")
    assert r.returncode == 1 and took < 10, (r.returncode, took, r.stderr)
    assert path.name in line and re.search(problem, line), line


def test_model_replaced_atomically_while_serving(tmp_path):
    served = tmp_path / "model.gguf"
    shutil.copyfile(MODEL, served)
    srv = FaultServer("--kv-memory-mib", "16", model=served)
    try:
        before = srv.complete("The weather today is", 16)["choices"][0]["text"]
        # An update drops a new copy beside it and renames it over the served path...
        shutil.copyfile(MODEL, tmp_path / "model.gguf.new")
        os.replace(tmp_path / "model.gguf.new", served)
        assert srv.complete("The weather today is", 16)["choices"][0]["text"] == before
        # ...and even a broken file renamed over it changes nothing: the mapped inode serves.
        (tmp_path / "model.gguf.bad").write_bytes(os.urandom(served.stat().st_size))
        os.replace(tmp_path / "model.gguf.bad", served)
        assert srv.complete("The weather today is", 16)["choices"][0]["text"] == before
        assert httpx.get(srv.base + "/v1/models", timeout=5).status_code == 200
        assert httpx.get(srv.base + "/api/status", timeout=5).status_code == 200
        srv.wait_idle()
    finally:
        srv.stop()
    assert srv.proc.returncode == 0


# 6. Profiles with bad values -------------------------------------------------------------------

@pytest.mark.parametrize("section,line,key", [
    ("engine", "kv_memory_mib = -5", "engine.kv_memory_mib"),
    ("engine", "kv_memory_mib = 0", "engine.kv_memory_mib"),
    ("engine", "kv_memroy_mib = 64", "kv_memroy_mib"),
    ("engine", 'max_seqs = "many"', "engine.max_seqs"),
    ("server", "port = 70000", "server.port"),
    ("engine", 'kv_type = "q3_k"', "engine.kv_type"),
])
def test_serve_refuses_a_profile_with_a_bad_value(section, line, key, tmp_path):
    profile = tmp_path / "bad.toml"
    profile.write_text(f'[model]\npath = "{MODEL}"\n\n[{section}]\n{line}\n')
    r, took = run_serve("-c", str(profile), "--port", str(free_port()))
    err = one_error_line(r.stderr)
    print(f"{line}: {err}")
    assert r.returncode == 1 and took < 5, (r.returncode, took, r.stderr)
    assert key in err and "bad.toml" in err and "line 5" in err, err
    assert "listening" not in r.stderr, "it must refuse before binding"


# 7. Logs to a full disk ------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_serving_continues_when_log_writes_fail():
    srv = FaultServer("--kv-memory-mib", "16", output="/dev/full", env={"RUST_LOG": "info"})
    try:
        expected = srv.complete("Logs are", 8)["choices"][0]["text"]
        for _ in range(3):
            assert srv.complete("Logs are", 8)["choices"][0]["text"] == expected
            bad = httpx.post(srv.base + "/v1/completions", content=b"{not json", timeout=10)
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
            assert httpx.get(srv.base + "/nowhere", timeout=10).status_code == 404
            s = post_raw(srv.port, {"prompt": "Logs are", "max_tokens": 8, "temperature": 0, "stream": True})
            text, finish = stream_text(sse_events(read_until(s, b"0\r\n\r\n")))
            s.close()
            assert text == expected and finish == "length"
            chat = httpx.post(srv.base + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
        # A client that leaves mid-stream is logged too.
        s = post_raw(srv.port, {"prompt": "Logs are", "max_tokens": 200, "ignore_eos": True, "stream": True})
        read_until(s, b"data: {")
        s.close()
        srv.wait_idle(timeout=3)
        assert srv.proc.poll() is None, "the server died writing its logs"
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=15) == 0
    finally:
        srv.stop()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_fatal_error_with_stderr_on_a_full_disk_still_exits_1():
    # The one-line error cannot be written; the exit code must still say "error", not panic (101).
    with open("/dev/full", "w") as full:
        r = subprocess.run([str(BINARY), "serve", "-m", "/nonexistent/model.gguf"], stdout=full, stderr=full,
                           timeout=15)
    assert r.returncode == 1


# 8. The port is taken -------------------------------------------------------------------------

def test_port_taken_by_another_process():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r, took = run_serve("-m", str(MODEL), "--port", str(port), "-t", "2", "--kv-memory-mib", "16")
    line = one_error_line(r.stderr)
    assert r.returncode == 1 and took < 5, (r.returncode, took, r.stderr)
    assert f"127.0.0.1:{port}" in line and "in use" in line, line


def test_port_taken_by_another_edgelm():
    """A second instance started by mistake must not share the port with the first."""
    first = FaultServer("--kv-memory-mib", "16")
    try:
        r, took = run_serve("-m", str(MODEL), "--port", str(first.port), "-t", "2", "--kv-memory-mib", "16")
        line = one_error_line(r.stderr)
        assert r.returncode == 1 and took < 5, (r.returncode, took, r.stderr)
        assert f"127.0.0.1:{first.port}" in line and "in use" in line, line
        # Every connection still reaches the first one.
        for _ in range(8):
            assert httpx.get(first.base + "/health", timeout=5).status_code == 200
        assert first.complete("Still here:", 4)["choices"][0]["text"]
        first.wait_idle()
    finally:
        first.stop()
    assert first.proc.returncode == 0
