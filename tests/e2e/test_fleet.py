"""A fleet on one machine, with the integrator's tools: three `edgelm serve` boxes on loopback
ports, HAProxy (Debian's) in front with health checks on /health, Prometheus (Debian's) scraping
the three with the shipped scrape config (deploy/prometheus/prometheus.yml), and `edgelm
loadgen` driving the front. Under that load one box is drained (SIGTERM) and another killed
(SIGKILL); no request may fail but those in flight on the killed box, the drained box's streams
complete, and Prometheus holds every box's series.

The metrics contract: what the endpoint picker (deploy/k3s/epp-config.yaml) reads from /metrics,
read the way it reads it (one unlabelled series per metric, TYPE gauge), plus `promtool check
metrics` on the whole page."""

import json
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import ARTIFACTS, BINARY, ROOT, Server, free_port

DEPLOY = ROOT / "deploy"
# The names deploy/k3s/epp-config.yaml maps (queue, running, KV, cache info).
QUEUE, RUNNING, KV, CACHE_INFO = ("edgelm_requests_waiting", "edgelm_requests_running",
                                  "edgelm_kv_cache_usage_ratio", "edgelm_cache_config_info")
BOX_FLAGS = ("-t", "1", "--kv-memory-mib", "64", "--max-seqs", "4", "--drain-seconds", "20")


def tool(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if Path(p).exists()), None)
    assert path, f"{name} missing: .ci/run installs it (apt-get install haproxy prometheus)"
    return path


def parse_exposition(text: str) -> tuple[dict, dict]:
    """TYPE per metric family, and the samples: name -> [(labels dict, value)]."""
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind.strip()
        elif line and not line.startswith("#"):
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?', line)
            assert m, f"unparsable sample line: {line!r}"
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            samples.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return types, samples


def epp_gauge(types: dict, samples: dict, name: str) -> float:
    """As the EPP's core-metrics-extractor reads a spec without labels: the family is a gauge
    and has exactly one series, unlabelled."""
    assert types.get(name) == "gauge", f"{name}: TYPE {types.get(name)!r}, want gauge"
    series = samples.get(name, [])
    assert len(series) == 1 and series[0][0] == {}, f"{name}: want one unlabelled series, got {series}"
    return series[0][1]


def test_metrics_contract_the_endpoint_picker_reads(tmp_path):
    s = Server("-t", "1", "--kv-memory-mib", "64", "--max-seqs", "2")
    try:
        text = httpx.get(s.base + "/metrics", timeout=5).text
        (tmp_path / "metrics.txt").write_text(text)
        # promtool reports nothing at all on the page (no lint warnings either).
        r = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr
        types, samples = parse_exposition(text)
        idle = {n: epp_gauge(types, samples, n) for n in (QUEUE, RUNNING, KV)}
        assert idle == {QUEUE: 0, RUNNING: 0, KV: 0}, idle
        assert types.get(CACHE_INFO) == "gauge", types.get(CACHE_INFO)
        (info,) = samples[CACHE_INFO]
        assert info[1] == 1 and set(info[0]) == {"block_size", "num_gpu_blocks"}, info
        assert int(info[0]["block_size"]) > 0 and int(info[0]["num_gpu_blocks"]) > 0, info

        # Under load (more streams than --max-seqs 2, so some wait) all three move, stay in range,
        # and are back to 0 afterwards.
        seen = {QUEUE: 0.0, RUNNING: 0.0, KV: 0.0}
        stop = threading.Event()

        def client(i):
            while not stop.is_set():
                with httpx.stream("POST", s.base + "/v1/completions", timeout=60,
                                  json={"prompt": f"Story {i}: once upon a time", "max_tokens": 24,
                                        "stream": True, "ignore_eos": True, "seed": i}) as r:
                    assert r.status_code in (200, 429), r.status_code
                    for _ in r.iter_lines():
                        pass

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(5)]
        for t in threads:
            t.start()
        deadline = time.time() + 20
        while time.time() < deadline and not (seen[QUEUE] >= 1 and seen[RUNNING] >= 2 and seen[KV] > 0):
            types, samples = parse_exposition(httpx.get(s.base + "/metrics", timeout=5).text)
            for n in seen:
                v = epp_gauge(types, samples, n)
                assert v >= 0 and (n != KV or v <= 1), (n, v)
                seen[n] = max(seen[n], v)
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert seen[RUNNING] >= 2 and seen[QUEUE] >= 1 and 0 < seen[KV] <= 1, seen
        s.wait_idle(timeout=10)
        types, samples = parse_exposition(httpx.get(s.base + "/metrics", timeout=5).text)
        assert epp_gauge(types, samples, KV) == 0
    finally:
        s.stop()


HAPROXY_CFG = """\
global
    maxconn 512
    log stdout format raw local0
defaults
    mode http
    log global
    # server, status, termination state, bytes, retries, accept date (s, ms), idle ms, total ms:
    # the request ran from accept + idle to accept + total.
    log-format "REQ %s %ST %ts %B %rc %Ts %ms %Ti %Tt"
    option http-buffer-request
    # Connection refused (killed box, before the check marks it down), a box that closes without
    # answering (requests queued on the killed box), 503 (a draining box refuses new work):
    # resent to another box. A response already under way cannot be resent.
    retry-on conn-failure empty-response 503
    retries 3
    option redispatch 1
    timeout connect 1s
    timeout client 120s
    timeout server 120s
frontend fleet
    bind 127.0.0.1:{port}
    default_backend boxes
backend boxes
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 300ms fall 1 rise 2
{servers}
"""


def start_haproxy(d: Path, port: int, boxes) -> subprocess.Popen:
    servers = "\n".join(f"    server box{i} 127.0.0.1:{b.port}" for i, b in enumerate(boxes))
    cfg = d / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.replace("{port}", str(port)).replace("{servers}", servers))
    r = subprocess.run([tool("haproxy"), "-c", "-f", cfg], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    p = subprocess.Popen([tool("haproxy"), "-db", "-f", cfg], stdout=open(d / "haproxy.log", "w"),
                         stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/health", p)
    return p


def start_prometheus(d: Path, port: int, boxes) -> subprocess.Popen:
    """The shipped config, byte for byte; only the targets file is ours."""
    shutil.copy(DEPLOY / "prometheus" / "prometheus.yml", d / "prometheus.yml")
    (d / "edgelm-targets.json").write_text(json.dumps(
        [{"targets": [f"127.0.0.1:{b.port}" for b in boxes], "labels": {"fleet": "test"}}]))
    p = subprocess.Popen([tool("prometheus"), f"--config.file={d / 'prometheus.yml'}",
                          f"--storage.tsdb.path={d / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=open(d / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/-/ready", p)
    return p


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"{proc.args[0]} exited with {proc.returncode}"
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not up after {timeout} s")


def prom(port: int, path: str, **params):
    r = httpx.get(f"http://127.0.0.1:{port}/api/v1/{path}", params=params, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def in_flight(box) -> int:
    m = box.metrics()
    return int(m[RUNNING] + m[QUEUE])


def test_fleet_behind_haproxy_survives_a_drain_and_a_kill(tmp_path):
    t_start = time.time()
    d = ARTIFACTS / "fleet"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    boxes = [Server(*BOX_FLAGS, output=str(d / f"box{i}.log")) for i in range(3)]
    procs = []
    try:
        hport, pport = free_port(), free_port()
        procs.append(start_haproxy(d, hport, boxes))
        procs.append(start_prometheus(d, pport, boxes))
        # Every box scraped at least once before anything goes down.
        deadline = time.time() + 20
        while time.time() < deadline:
            up = {t["labels"]["instance"]: t["health"] for t in prom(pport, "targets")["activeTargets"]}
            if len(up) == 3 and set(up.values()) == {"up"}:
                break
            time.sleep(0.25)
        assert len(up) == 3 and set(up.values()) == {"up"}, up

        report = d / "loadgen.json"
        load = subprocess.Popen(
            [str(BINARY), "loadgen", "--url", f"http://127.0.0.1:{hport}", "--concurrency", "4",
             "--duration", "26", "--seed", "7", "--stream-share", "0.8", "--disconnect-share", "0",
             "--long-share", "0", "--shared-share", "0.3", "--max-prompt-words", "48", "--system-words", "24",
             "--min-max-tokens", "16", "--max-max-tokens", "40", "--ignore-eos", "--warmup", "1",
             "--timeout", "60", "--json", str(report)],
            stdout=open(d / "loadgen.out", "w"), stderr=subprocess.STDOUT)
        drained, killed, survivor = boxes

        def busy(box, timeout=10):
            """Waits until BOX has a request in flight (so the drain or kill hits live work)."""
            deadline = time.time() + timeout
            while time.time() < deadline:
                n = in_flight(box)
                if n > 0:
                    return n
                time.sleep(0.02)
            raise AssertionError("box never busy")

        time.sleep(6)
        drained_in_flight = busy(drained)
        drained.proc.send_signal(signal.SIGTERM)
        time.sleep(4)
        killed_in_flight = busy(killed)
        t_kill = time.time()
        killed.proc.kill()
        killed.proc.wait()

        assert load.wait(timeout=120) == 0, (d / "loadgen.out").read_text()
        rep = json.loads(report.read_text())["report"]
        assert drained.proc.wait(timeout=30) == 0, f"drained box exited with {drained.proc.returncode}"
        drained_log = Path(d / "box0.log").read_text()
        assert "stopping: draining" in drained_log and "cut short" not in drained_log, drained_log[-2000:]

        # HAProxy's log: one line per request, with the box that answered it.
        lines = [l.split() for l in (d / "haproxy.log").read_text().splitlines() if l.startswith("REQ ")]
        per_box = {f"box{i}": [] for i in range(3)}
        for _, server, status, term, _, _, ts, ms, ti, tt in lines:
            t0 = int(ts) + int(ms) / 1000
            per_box.setdefault(server, []).append((status, term, t0 + int(ti) / 1000, t0 + int(tt) / 1000))
        bad = {b: [x for x in v if x[:2] != ("200", "--")] for b, v in per_box.items()}
        # The drained box answered every request it took, to the end (its in-flight streams at
        # SIGTERM included), and the survivor every one of its own.
        assert bad["box0"] == [] and bad["box2"] == [], bad
        assert len(per_box["box0"]) >= drained_in_flight >= 1
        assert all(s == "<NOSRV>" for s in per_box if s not in ("box0", "box1", "box2")), per_box.keys()
        # Only requests in flight on the killed box failed: each failure is one that HAProxy had
        # sent to it before the kill and that was still running then (requests queued there, with
        # no answer yet, HAProxy resends elsewhere; so at most its running batch fails).
        assert rep["failed"] == len(bad["box1"]), (rep, bad["box1"])
        assert len(bad["box1"]) <= 4, bad["box1"]  # --max-seqs 4
        for status, term, begin, end in bad["box1"]:
            assert begin <= t_kill + 0.05 and end >= t_kill - 0.5, (status, term, begin, end, t_kill)
        assert rep["ok"] >= 6 and rep["sent"] == rep["ok"] + rep["failed"] + rep.get("disconnected", 0), rep
        assert len(per_box["box2"]) > 0 and len(per_box["box1"]) > 0

        # Prometheus: every box's series (also the two gone), and `up` says which are gone.
        time.sleep(max(0.0, t_kill + 6 - time.time()))
        for name in (RUNNING, QUEUE, "up"):
            series = prom(pport, "series", **{"match[]": name, "start": str(t_start)})
            assert {s["instance"] for s in series} == {f"127.0.0.1:{b.port}" for b in boxes}, (name, series)
            assert all(s["job"] == "edgelm" and s["fleet"] == "test" for s in series), series
        up = {r["metric"]["instance"]: r["value"][1] for r in prom(pport, "query", query="up")["result"]}
        assert up == {f"127.0.0.1:{drained.port}": "0", f"127.0.0.1:{killed.port}": "0",
                      f"127.0.0.1:{survivor.port}": "1"}, up
        print(f"fleet: {rep['ok']} ok, {rep['failed']} failed (killed box had {killed_in_flight} in flight), "
              f"drained box had {drained_in_flight}, whole test {time.time() - t_start:.0f} s")
        survivor.stop()
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for b in boxes:
            if b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait()
            b.log.close()
