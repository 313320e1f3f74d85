"""`edgelm loadgen` against the real server, against a deliberately broken one, and its flags."""

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import ARTIFACTS, BINARY


def loadgen(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(BINARY), "loadgen", *args], capture_output=True, text=True, timeout=timeout)


def small_load(base: str, out, seed: int = 3, *extra: str):
    return loadgen("--url", base, "--rate", "1.5", "--duration", "10", "--seed", str(seed),
                   "--stream-share", "0.8", "--disconnect-share", "0.5", "--long-share", "0",
                   "--max-prompt-words", "96", "--system-words", "40", "--min-max-tokens", "8",
                   "--max-max-tokens", "24", "--warmup", "1", "--fail-on-error", "--json", str(out), *extra)


def test_mixed_load_is_served_measured_and_leaves_the_server_idle(server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    outs = [ARTIFACTS / "loadgen-a.json", ARTIFACTS / "loadgen-b.json"]
    for out in outs:
        r = small_load(server.base, out)
        assert r.returncode == 0, r.stdout + r.stderr
    a, b = (json.loads(p.read_text()) for p in outs)
    rep = a["report"]
    assert rep["failed"] == 0 and rep["errors"] == {}
    assert rep["ok"] >= 3 and rep["disconnected"] >= 1, rep
    assert rep["ttft"]["count"] >= 1 and rep["itl"]["count"] >= 10
    assert 0 < rep["ttft"]["p50"] <= rep["ttft"]["p99"]
    assert a["after"] == {"kv_blocks_used": 0.0, "running": 0.0, "waiting": 0.0}
    # The server's own figures were watched through /metrics.
    assert a["server"]["fds_final"] > 0 and a["server"]["threads_final"] > 0
    assert a["server"]["rss_final_mib"] > 50
    # Same seed, same requests: the same prompts, and (seeded sampling) the same completions.
    for k in ("sent", "ok", "disconnected", "prompt_tokens", "completion_tokens"):
        assert a["report"][k] == b["report"][k], k
    assert "TTFT (streams)" in small_load(server.base, outs[0]).stdout


class Broken(BaseHTTPRequestHandler):
    """An 'OpenAI-compatible' server that gets things wrong in turn."""

    count = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def reply(self, status, body: bytes, ctype="application/json", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(200, json.dumps({"object": "list", "data": [{"id": "broken", "object": "model"}]}).encode())

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with Broken.lock:
            Broken.count += 1
            n = Broken.count
        chunk = {"object": "text_completion", "choices": [{"index": 0, "text": "hi", "finish_reason": None}]}
        if req.get("messages"):
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
        match n % 4:
            case 0:
                self.reply(500, b'{"error": {"message": "boom", "type": "server_error"}}')
            case 1:
                self.reply(429, b'{"error": {"message": "busy", "type": "rate_limit"}}')  # no Retry-After
            case 2 if req.get("stream"):
                # A stream that never says [DONE].
                self.reply(200, f"data: {json.dumps(chunk)}\n\n".encode(), "text/event-stream")
            case _:
                self.reply(200, b"this is not json")


def test_a_broken_server_is_caught_and_named():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    out = ARTIFACTS / "loadgen-broken.json"
    try:
        r = loadgen("--url", f"http://127.0.0.1:{httpd.server_port}", "--concurrency", "2", "--requests", "24",
                    "--stream-share", "0.5", "--fail-on-error", "--json", str(out))
    finally:
        httpd.shutdown()
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and "requests failed" in r.stderr
    rep = json.loads(out.read_text())["report"]
    assert rep["ok"] == 0 and rep["failed"] == 24
    errors = rep["errors"]
    assert errors["http_500"] >= 1
    assert errors["malformed: 429 without Retry-After"] >= 1
    assert any(k.startswith("malformed: ") and "not JSON" in k for k in errors), errors
    assert "after" not in json.loads(out.read_text()), "no edgelm /metrics there: nothing to check"


@pytest.mark.parametrize("args, message", [
    (["--rate=-1"], "--rate must be a positive number"),
    (["--rate", "1", "--stream-share", "1.5"], "--stream-share must be between 0 and 1"),
    ([], "give --rate"),
    (["--rate", "1", "--url", "http://127.0.0.1:9"], "cannot reach the server"),
])
def test_bad_flags_get_one_line(args, message):
    r = loadgen(*args, timeout=30)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
