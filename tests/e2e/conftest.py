"""Starts the real edgelm binary on the real model for the HTTP end-to-end tests."""

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
# EDGELM_BINARY: test another build of the server (default: the release build of this tree;
# scripts/test.sh points it at the `suite` build its `cargo test` step already made).
BINARY = Path(os.environ.get("EDGELM_BINARY", ROOT / "target" / "release" / "edgelm"))
MODEL = Path(os.environ.get("EDGELM_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
REFERENCE = Path(os.environ.get("EDGELM_REFERENCE_DIR", ROOT / "tests" / "data"))
ARTIFACTS = ROOT / "target" / "test-artifacts"


def require_binary() -> None:
    """Fails the test with the command that builds the binary when it is missing."""
    assert BINARY.exists(), f"{BINARY} missing: cargo build --release first (or set EDGELM_BINARY)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra: str, env: dict | None = None, port: int | None = None, model: Path = MODEL,
                 output: str | None = None):
        """`edgelm serve` on the reference model with test defaults that EXTRA flags override; it
        returns once /health says 200. OUTPUT: where stdout/stderr go (default a log file in
        target/test-artifacts)."""
        require_binary()
        assert Path(model).exists() or model != MODEL, f"{MODEL} missing: run packaging/fetch-model.sh"
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.log = open(output or ARTIFACTS / f"server-{self.port}.log", "w")
        defaults = {"-t": "2", "--kv-memory-mib": "128", "--max-seqs": "16", "--drain-seconds": "10"}
        for flag in extra[::2]:
            defaults.pop(flag, None)
        args = [str(BINARY), "serve", "-m", str(model), "--port", str(self.port),
                *[x for kv in defaults.items() for x in kv], *extra]
        self.env = env
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                self.log.close()
                tail = Path(self.log.name).read_text()[-2000:] if self.log.name != "/dev/full" else ""
                raise RuntimeError(f"server exited with {self.proc.returncode}: {tail}")
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        raise RuntimeError("server did not become ready")

    def metrics(self, headers=None) -> dict:
        """The unlabelled series; a server holding several models labels each engine series
        `model="id"`, and those are summed over the models."""
        text = httpx.get(self.base + "/metrics", headers=headers, timeout=5).text
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            k, v = line.rsplit(" ", 1)
            if "{" in k:
                k, labels = k.split("{", 1)
                if not labels.startswith('model="') or '",' in labels:
                    continue
            out[k] = out.get(k, 0.0) + float(v)
        return out

    def wait_idle(self, timeout=5.0, headers=None):
        """Every test ends with nothing running and no KV block in use."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics(headers)
            if m["edgelm_requests_running"] == 0 and m["edgelm_requests_waiting"] == 0 and m["edgelm_kv_blocks_used"] == 0:
                return m
            time.sleep(0.02)
        raise AssertionError(f"server not idle after {timeout}s: {m}")

    def stop(self):
        """Every server a test starts must end idle (0 KV blocks in use, nothing running or
        waiting) and exit 0 on SIGTERM: nothing lost, nothing leaked."""
        if self.proc.poll() is None:
            key = (getattr(self, "env", None) or {}).get("EDGELM_API_KEY")
            try:
                self.wait_idle(headers={"Authorization": f"Bearer {key}"} if key else None)
            except BaseException:
                self.proc.kill()
                self.proc.wait()
                self.log.close()
                raise
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        assert self.proc.returncode == 0, f"server exited with {self.proc.returncode} on SIGTERM"



@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()
    assert s.proc.returncode == 0, f"server exited with {s.proc.returncode} on SIGTERM"


@pytest.fixture(autouse=True)
def leaves_no_blocks(request):
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").wait_idle()


@pytest.fixture(scope="session")
def reference():
    return json.loads((REFERENCE / "smollm2-llamacpp.json").read_text())


@pytest.fixture(scope="session")
def confident_case(reference):
    """The peer's greedy case with a top-2 margin of at least 0.5 nats at every token: greedy
    text may leave the peer's only where it hesitated (docs/numerics.md), so on this one any
    correct engine gives the peer's text exactly."""
    for case in reference["greedy"]:
        if all(top[0][1] - top[1][1] >= 0.5 for top in case["top5"]):
            return case
    raise AssertionError("no reference case without a near-tie")
