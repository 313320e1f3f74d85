"""The offline bundle: install.sh verifies SHA256SUMS and installs into a fresh root; the
installed static binary, chrooted into that root inside a network namespace with no route
out, serves a real /v1/completions request on loopback with the installed profile."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

from appliance import MODEL, ROOT, cargo_version, script_env, static_binary


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    assert MODEL.exists(), f"{MODEL} missing: run packaging/fetch-model.sh"
    static_binary("amd64")
    proc = subprocess.run([str(ROOT / "scripts" / "make-bundle.sh"), "amd64", str(MODEL)],
                          capture_output=True, text=True, env=script_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    tarball = ROOT / proc.stdout.strip().splitlines()[-1]
    assert tarball.name == f"edgelm-{cargo_version()}-amd64.tar.gz"
    out = tmp_path_factory.mktemp("bundle")
    with tarfile.open(tarball) as tf:
        tf.extractall(out, filter="tar")
    d = out / f"edgelm-{cargo_version()}-amd64"
    names = {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}
    assert {"bin/edgelm", "install.sh", "SHA256SUMS", "profile.toml", f"models/{MODEL.name}",
            "systemd/edgelm.service", "systemd/edgelm.sysusers", "systemd/edgelm.tmpfiles",
            "systemd/edgelm.default"} <= names, names
    sums = (d / "SHA256SUMS").read_text().split("\n")
    assert len([line for line in sums if line]) == len(names) - 1
    return d


def test_checksum_mismatch_installs_nothing(bundle_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(bundle_dir, bad)
    with open(bad / "profile.toml", "a") as f:
        f.write("# tampered\n")
    root = tmp_path / "root"
    proc = subprocess.run([str(bad / "install.sh"), "--root", str(root)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "checksum" in proc.stderr
    assert not root.exists()


NAMESPACE_SCRIPT = textwrap.dedent("""\
    set -eu
    if command -v ip >/dev/null 2>&1; then ip link set lo up; else "$PYTHON" -c '
    import fcntl, socket, struct
    s = socket.socket(); ifr = struct.pack("16sH", b"lo", 0)
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr))[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))'; fi
    "$BUNDLE/install.sh" --root "$ROOT" > "$ARTIFACTS/install.log"
    mkdir -p "$ROOT/proc" "$ROOT/tmp" && mount -t proc proc "$ROOT/proc"
    chroot "$ROOT" /usr/bin/edgelm serve --config /etc/edgelm/profile.toml -t 2 --kv-memory-mib 64 \\
        > "$ARTIFACTS/server.log" 2>&1 &
    pid=$!
    status=0
    "$PYTHON" "$CLIENT" || status=$?
    kill -TERM $pid; wait $pid || true
    exit $status
    """)

CLIENT = textwrap.dedent("""\
    import http.client, json, socket, sys, time
    deadline = time.time() + 60
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", 8080, timeout=2); c.request("GET", "/health")
            if c.getresponse().status == 200: break
        except OSError:
            pass
        if time.time() > deadline: sys.exit("server did not become ready")
        time.sleep(0.2)
    c = http.client.HTTPConnection("127.0.0.1", 8080, timeout=120)
    body = {"model": "edgelm", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); data = json.loads(r.read())
    print(json.dumps({"status": r.status, "body": data}))
    # No route out of the namespace.
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect(("1.1.1.1", 443)); print(json.dumps({"outbound": "connected"}))
    except OSError as e:
        print(json.dumps({"outbound": "failed", "errno": e.errno}))
    """)


def test_offline_install_and_serve_in_chroot_without_network(bundle_dir, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("chroot") is None:
        pytest.skip("needs root, unshare and chroot")
    root = tmp_path / "root"
    artifacts = ROOT / "target" / "test-artifacts" / "bundle"
    artifacts.mkdir(parents=True, exist_ok=True)
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    env = {**os.environ, "BUNDLE": str(bundle_dir), "ROOT": str(root), "ARTIFACTS": str(artifacts),
           "PYTHON": sys.executable, "CLIENT": str(client)}
    proc = subprocess.run(["unshare", "--net", "--mount", "bash", "-c", NAMESPACE_SCRIPT],
                          capture_output=True, text=True, env=env, timeout=300)
    server_log = (artifacts / "server.log").read_text() if (artifacts / "server.log").exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + server_log
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    reply = next(x for x in lines if "status" in x)
    assert reply["status"] == 200, reply
    text = reply["body"]["choices"][0]["text"]
    assert text.strip(), reply
    outbound = next(x for x in lines if "outbound" in x)
    assert outbound["outbound"] == "failed", outbound

    # What install.sh put in the root.
    profile = (root / "etc" / "edgelm" / "profile.toml").read_text()
    assert f'path = "/var/lib/edgelm/models/{MODEL.name}"' in profile
    assert (root / "var" / "lib" / "edgelm" / "models" / MODEL.name).stat().st_size == MODEL.stat().st_size
    assert os.access(root / "usr" / "bin" / "edgelm", os.X_OK)
    for p in ("etc/systemd/system/edgelm.service", "etc/sysusers.d/edgelm.conf", "etc/tmpfiles.d/edgelm.conf",
              "etc/default/edgelm"):
        assert (root / p).is_file(), p
    # Not the real root: no user created on this machine, service not started, how-to printed.
    assert "chroot" in (artifacts / "install.log").read_text()
