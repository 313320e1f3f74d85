"""`edgelm serve` as a systemd Type=notify service: READY=1 only once /health answers 200,
WATCHDOG=1 from the engine loop (idle and busy), STOPPING=1 when SIGTERM starts the drain, and
journal-friendly log lines. The service manager is played by a Unix datagram socket here; a
real systemd is tried only where one runs."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import ARTIFACTS, BINARY, MODEL, Server, free_port, require_binary

# What a systemd unit would put in the environment; stripped so each test picks its own.
SYSTEMD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM", "INVOCATION_ID")

# With WATCHDOG_USEC=1 s the engine pings every 0.5 s; allow scheduling noise on a loaded box
# but stay well under the 1 s after which systemd would kill the service.
MAX_PING_GAP = 0.75


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_VARS}
    env.update(extra)
    return env


class NotifyServer:
    """edgelm serve with NOTIFY_SOCKET pointing at a socket we read, started like conftest's
    Server (same flags) but without waiting for /health, so the start-up itself is observed."""

    def __init__(self, watchdog_usec: int = 1_000_000):
        require_binary()
        assert MODEL.exists(), f"{MODEL} missing: run packaging/fetch-model.sh"
        self.dir = tempfile.mkdtemp(prefix="edgelm-notify-")
        self.sock_path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(0.2)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.messages: list[tuple[float, str]] = []  # (monotonic time, one state line)
        self.health_at_ready = None
        self.health_log: list[tuple[float, int | None, str]] = []  # (request start, status, state)
        self.lock = threading.Lock()
        self.running = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.log_path = ARTIFACTS / f"server-notify-{self.port}.log"
        self.log = open(self.log_path, "w")
        args = [str(BINARY), "serve", "-m", str(MODEL), "--port", str(self.port), "--drain-seconds", "10",
                "-t", "2", "--kv-memory-mib", "128", "--max-seqs", "16"]
        env = clean_env(NOTIFY_SOCKET=self.sock_path, WATCHDOG_USEC=str(watchdog_usec))
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.poller = threading.Thread(target=self._poll_health, daemon=True)
        self.poller.start()

    def _read(self):
        while self.running:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            now = time.monotonic()
            lines = data.decode().splitlines()
            if "READY=1" in lines and self.health_at_ready is None:
                # The moment systemd would consider the service up: it must serve.
                try:
                    r = httpx.get(self.base + "/health", timeout=2)
                    self.health_at_ready = (r.status_code, r.json().get("status"))
                except httpx.HTTPError as e:
                    self.health_at_ready = (None, repr(e))
            with self.lock:
                self.messages.extend((now, line) for line in lines)

    def _poll_health(self):
        """Until READY: what /health said, and when it was asked."""
        while self.running and self.first("READY=1") is None:
            t = time.monotonic()
            try:
                r = httpx.get(self.base + "/health", timeout=1)
                self.health_log.append((t, r.status_code, r.json().get("status")))
            except httpx.HTTPError:
                self.health_log.append((t, None, "no answer"))
            time.sleep(0.01)

    def snapshot(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.messages)

    def first(self, line: str):
        return next((t for t, m in self.snapshot() if m == line), None)

    def wait_for(self, line: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.first(line)
            if t is not None:
                return t
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode} before {line}")
            time.sleep(0.01)
        raise AssertionError(f"no {line} within {timeout} s; got {self.snapshot()}")

    def pings(self, start: float, end: float) -> list[float]:
        return [t for t, m in self.snapshot() if m == "WATCHDOG=1" and start <= t <= end]

    def close(self):
        self.running = False
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def assert_pinged_throughout(pings: list[float], start: float, end: float):
    points = [start, *pings, end]
    gaps = [b - a for a, b in zip(points, points[1:])]
    print(f"max watchdog gap {max(gaps):.3f} s over {len(pings)} pings")
    assert max(gaps) <= MAX_PING_GAP, f"watchdog silent for {max(gaps):.3f} s (gaps {gaps})"


def stream_completion(base: str, max_tokens: int, on_chunk=None) -> dict:
    """Streams a completion; returns the chunks' times, finish reason and whether [DONE] came."""
    out = {"times": [], "finish": None, "done": False, "text": "", "usage": None}
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            if payload == "[DONE]":
                out["done"] = True
                continue
            chunk = json.loads(payload)
            if not chunk["choices"]:
                out["usage"] = chunk["usage"]
                continue
            choice = chunk["choices"][0]
            out["times"].append(time.monotonic())
            out["text"] += choice["text"]
            out["finish"] = choice["finish_reason"] or out["finish"]
            if on_chunk:
                on_chunk(len(out["times"]))
    return out


@pytest.fixture(scope="module")
def notified():
    s = NotifyServer()
    yield s
    s.close()


def test_ready_only_once_health_answers_200(notified):
    t_ready = notified.wait_for("READY=1", timeout=60)
    assert notified.health_at_ready == (200, "ready"), f"/health at READY=1: {notified.health_at_ready}"
    msgs = notified.snapshot()
    ready_datagram = [m for t, m in msgs if t == t_ready]
    assert any(m.startswith("STATUS=serving ") for m in ready_datagram), msgs
    # Nothing claimed readiness early: STATUS=loading came first, and every /health that did
    # not answer 200 (no listener yet, or "loading") was asked before READY=1 arrived.
    assert msgs[0][1] == "STATUS=loading the model", msgs
    assert [m for _, m in msgs].count("READY=1") == 1
    loading = [(t, st) for t, code, st in notified.health_log if code != 200]
    assert loading, "the poller never saw the model loading (start-up too fast to observe?)"
    assert all(t < t_ready for t, _ in loading), f"/health not ready after READY=1: {loading}"
    # The model was loaded before READY=1: the log says so ahead of the first request.
    assert "model loaded; ready" in notified.log_path.read_text()


def test_watchdog_pings_while_idle(notified):
    notified.wait_for("READY=1", timeout=60)
    start = time.monotonic()
    time.sleep(3.0)
    end = time.monotonic()
    pings = notified.pings(start, end)
    assert len(pings) >= 4, f"only {len(pings)} WATCHDOG=1 in 3 s idle"
    assert_pinged_throughout(pings, start, end)


def test_watchdog_pings_while_generating(notified):
    notified.wait_for("READY=1", timeout=60)
    out = stream_completion(notified.base, 400)
    assert out["finish"] == "length" and out["done"] and out["usage"]["completion_tokens"] == 400
    start, end = out["times"][0], out["times"][-1]
    assert end - start > 1.5, f"the stream took only {end - start:.2f} s; too short to tell"
    pings = notified.pings(start, end)
    assert_pinged_throughout(pings, start, end)


def test_sigterm_sends_stopping_and_drains_the_stream(notified):
    notified.wait_for("READY=1", timeout=60)
    assert notified.first("STOPPING=1") is None
    signalled = {}

    def on_chunk(n):
        if n == 10:
            signalled["t"] = time.monotonic()
            notified.proc.send_signal(signal.SIGTERM)

    out = stream_completion(notified.base, 400, on_chunk)
    t_stop = notified.wait_for("STOPPING=1", timeout=10)
    assert "t" in signalled
    assert signalled["t"] <= t_stop < out["times"][-1], "STOPPING=1 must come at drain start, before the stream ends"
    assert out["done"] and out["finish"] == "length", out
    assert out["usage"]["completion_tokens"] == 400, out["usage"]
    assert notified.proc.wait(timeout=30) == 0
    assert notified.first("READY=1") < t_stop
    # The watchdog kept going while the drain ran.
    assert_pinged_throughout(notified.pings(t_stop, out["times"][-1]), t_stop, out["times"][-1])


REQUEST_LINE = re.compile(
    r"^<6>edgelm::server(?:::\w+)?: (?P<id>cmpl-\d+): (?P<outcome>[^,]+), prompt_tokens=(?P<prompt>\d+) "
    r"completion_tokens=(?P<completion>\d+) ttft=(?P<ttft>[\d.]+s|-) duration=(?P<duration>[\d.]+)s$"
)
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")


def test_journal_log_lines_carry_priorities_and_no_timestamp():
    s = Server(env=clean_env(JOURNAL_STREAM="8:12345", INVOCATION_ID="0123456789abcdef"))
    try:
        r = httpx.post(s.base + "/v1/completions",
                       json={"prompt": "The capital of France is", "max_tokens": 12, "ignore_eos": True}, timeout=30)
        assert r.status_code == 200
        done = r.json()
        # A client that leaves mid-stream: its request logs as cancelled.
        body = json.dumps({"prompt": "Tell me a story", "max_tokens": 300, "stream": True, "ignore_eos": True})
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
            c.recv(4096)
        s.wait_idle(timeout=10)
    finally:
        s.stop()
    assert s.proc.returncode == 0
    lines = [l for l in Path(s.log.name).read_text().splitlines() if l]
    assert lines
    for l in lines:
        assert re.match(r"^<[0-7]>", l), f"no priority prefix: {l!r}"
        assert not TIMESTAMP.search(l), f"timestamp in a journal line: {l!r}"
    assert any(l.startswith("<6>") and "model loaded; ready" in l for l in lines)
    reqs = [m for m in map(REQUEST_LINE.match, lines) if m]
    mine = [m for m in reqs if m["id"] == done["id"]]
    assert len(mine) == 1, f"expected one log line for {done['id']}: {lines}"
    m = mine[0]
    assert m["outcome"] == "length"
    assert int(m["prompt"]) == done["usage"]["prompt_tokens"]
    assert int(m["completion"]) == done["usage"]["completion_tokens"] == 12
    ttft, duration = float(m["ttft"].rstrip("s")), float(m["duration"])
    assert 0 < ttft <= duration
    cancelled = [m for m in reqs if m["id"] != done["id"]]
    assert len(cancelled) == 1 and cancelled[0]["outcome"] == "cancelled (client gone)", lines
    assert int(cancelled[0]["completion"]) < 300


def test_plain_log_format_outside_systemd(notified):
    """Without JOURNAL_STREAM/INVOCATION_ID (the notify server above) lines keep env_logger's
    timestamped format."""
    notified.wait_for("READY=1", timeout=60)
    text = notified.log_path.read_text()
    loaded = [l for l in text.splitlines() if "model loaded; ready" in l]
    assert loaded and TIMESTAMP.search(loaded[0]) and not loaded[0].startswith("<")


def systemd_available() -> str | None:
    if shutil.which("systemd-run") is None or shutil.which("systemctl") is None:
        return "systemd-run/systemctl not installed"
    try:
        state = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"systemctl is-system-running failed: {e}"
    if state.stdout.strip() not in ("running", "degraded"):
        return f"systemd is not PID 1 here (is-system-running: {state.stdout.strip() or state.stderr.strip()})"
    if os.geteuid() != 0:
        return "needs root to start a transient system unit"
    return None


@pytest.mark.skipif(systemd_available() is not None, reason=str(systemd_available()))
def test_real_systemd_type_notify_unit():
    port = free_port()
    unit = f"edgelm-test-{port}"
    cmd = ["systemd-run", f"--unit={unit}", "--collect", "-p", "Type=notify", "-p", "WatchdogSec=2",
           "-p", "TimeoutStartSec=60", "-p", "TimeoutStopSec=30", str(BINARY), "serve", "-m", str(MODEL.resolve()),
           "--port", str(port), "-t", "2", "--kv-memory-mib", "128", "--drain-seconds", "10"]
    try:
        # For Type=notify, systemd-run returns once the start job is done, i.e. after READY=1.
        subprocess.run(cmd, check=True, timeout=90)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        show = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState", "-p", "StatusText"],
                              capture_output=True, text=True).stdout
        assert "ActiveState=active" in show and "StatusText=serving" in show, show
        time.sleep(5)  # longer than WatchdogSec: still alive means the pings arrive
        assert "ActiveState=active" in subprocess.run(["systemctl", "show", unit, "-p", "ActiveState"],
                                                      capture_output=True, text=True).stdout
        subprocess.run(["systemctl", "stop", unit], check=True, timeout=60)
        result = subprocess.run(["systemctl", "show", unit, "-p", "Result", "-p", "ExecMainStatus"],
                                capture_output=True, text=True).stdout
        assert "ExecMainStatus=0" in result or not result.strip(), result
    finally:
        subprocess.run(["systemctl", "stop", unit], capture_output=True)
