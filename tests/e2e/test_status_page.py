"""The field technician's status page, rendered by headless Chromium from the binary's own
HTML (no external assets), showing live figures; the screenshot is kept as an artifact."""

import shutil
import subprocess

import httpx
import pytest

from conftest import ARTIFACTS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=4000", "--window-size=1100,800"]


def test_status_page_renders_live_figures(server, tmp_path):
    assert CHROMIUM, "chromium is not installed (.ci/run installs Debian's chromium)"
    # Some traffic first, so the figures and charts have something to show.
    for _ in range(2):
        httpx.post(server.base + "/v1/completions", json={"prompt": "Hello there", "max_tokens": 8}, timeout=60)
    page = httpx.get(server.base + "/").text
    assert "<script>" in page and "http://" not in page and "https://" not in page, "no external assets"
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", server.base + "/"], capture_output=True, text=True, timeout=120).stdout
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in dom, "the model name was filled in by the page's own script"
    assert 'id="state" class="label">ready<' in dom
    assert 'id="gen">–<' not in dom, "live generated-token count shown"
    assert 'id="constrained">–<' not in dom, "constrained requests and mask time shown"
    status = httpx.get(server.base + "/api/status").json()
    assert f'id="version" class="label">v{status["version"]}<' in dom, "version shown"
    assert f'id="backend">backend: {status["backend"]}<' in dom and status["backend"] == "cpu"
    assert status["resident_bytes"] > 0 and status["kv_pool_bytes"] > 0 and status["weight_bytes"] > 0
    assert 'id="mem">–<' not in dom and "KV pool" in dom, "memory shown"
    assert f'id="errors">{status["errors"]}<' in dom, "error count shown"
    assert f'id="cancelled">{status["cancelled"]}<' in dom and "cancelled" not in status["errors_by_reason"]
    shot = ARTIFACTS / "status-page.png"
    subprocess.run([*common, f"--screenshot={shot}", server.base + "/"], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 5000
