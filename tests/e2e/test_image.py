"""The OCI image archive (scripts/build-image.sh), checked with the tools an integrator has and no
container daemon: skopeo reads the archive's index (linux/amd64 and linux/arm64), umoci unpacks
each image, the amd64 image's /edgelm prints its version and serves a completion from a model
outside the image, the arm64 image's /edgelm runs (qemu-user) on the glibc that the image itself
carries. The binaries are the ones scripts/test.sh built before pytest (target/static/amd64 from
scripts/build-static.sh; the arm64 `cuda` build from scripts/build-image.sh)."""

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import BINARY, MODEL, ROOT, free_port

AMD64 = Path(os.environ.get("EDGELM_AMD64_BIN", ROOT / "target" / "static" / "amd64" / "edgelm"))
ARM64 = Path(os.environ.get("EDGELM_ARM64_BIN",
                            ROOT / "target" / "aarch64-unknown-linux-gnu" / "release" / "edgelm"))


def run(*args, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)
    assert r.returncode == 0, f"{args}: {r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    for tool in ("skopeo", "umoci", "qemu-aarch64"):
        assert shutil.which(tool), f"{tool} missing (.ci/run installs it)"
    for b, how in ((AMD64, "scripts/build-static.sh amd64"), (ARM64, "scripts/build-image.sh")):
        assert b.exists(), f"{b} missing: {how} first (or set EDGELM_AMD64_BIN / EDGELM_ARM64_BIN)"
    d = tmp_path_factory.mktemp("image")
    env = {**os.environ, "EDGELM_AMD64_BIN": str(AMD64), "EDGELM_ARM64_BIN": str(ARM64)}
    t0 = time.time()
    outs = []
    for n in ("a", "b"):
        out = d / f"edgelm-oci-{n}.tar"
        run(ROOT / "scripts" / "build-image.sh", env={**env, "EDGELM_IMAGE_OUT": str(out)})
        outs.append(out)
    print(f"two image builds: {time.time() - t0:.1f} s")
    return d, outs


def test_the_archive_is_reproducible_and_an_oci_layout(image):
    _, (a, b) = image
    # Same binaries, same bytes: layer tars are normalised (uid 0, mtime 0, sorted), gzip mtime 0.
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as t:
        names = t.getnames()
        assert {"oci-layout", "index.json"} <= set(names)
        assert json.load(t.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        top = json.load(t.extractfile("index.json"))
    assert all(n in ("oci-layout", "index.json", "blobs", "blobs/sha256") or n.startswith("blobs/sha256/")
               for n in names), names
    (ref,) = top["manifests"]
    assert ref["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert ref["annotations"]["org.opencontainers.image.ref.name"] == version()


def version() -> str:
    return run(AMD64, "--version").stdout.split()[1]


def test_skopeo_lists_both_platforms(image):
    _, (a, _) = image
    index = json.loads(run("skopeo", "inspect", "--raw", f"oci-archive:{a}").stdout)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    plats = sorted((m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"])
    assert plats == [("linux", "amd64"), ("linux", "arm64")], index
    for arch in ("amd64", "arm64"):
        cfg = json.loads(run("skopeo", "--override-os", "linux", "--override-arch", arch, "inspect", "--config",
                             f"oci-archive:{a}").stdout)
        assert (cfg["os"], cfg["architecture"]) == ("linux", arch)
        assert cfg["config"]["Entrypoint"] == ["/edgelm"]
        assert cfg["config"]["Cmd"][0] == "serve" and "/models/model.gguf" in cfg["config"]["Cmd"]
        assert len(cfg["rootfs"]["diff_ids"]) == 1


def unpack(d: Path, archive: Path, arch: str) -> Path:
    run("skopeo", "--override-os", "linux", "--override-arch", arch, "copy", "-q",
        f"oci-archive:{archive}", f"oci:{d / 'oci'}:{arch}")
    bundle = d / f"bundle-{arch}"
    run("umoci", "unpack", "--rootless", "--image", f"{d / 'oci'}:{arch}", bundle)
    return bundle


def test_the_amd64_image_runs_and_serves_a_completion(image):
    d, (a, _) = image
    bundle = unpack(d, a, "amd64")
    rootfs = bundle / "rootfs"
    # An empty base: the static binary and an empty /tmp, nothing else.
    assert sorted(p.name for p in rootfs.iterdir()) == ["edgelm", "tmp"]
    assert "statically linked" in run("file", "-b", rootfs / "edgelm").stdout or \
        "static-pie" in run("file", "-b", rootfs / "edgelm").stdout
    assert run(rootfs / "edgelm", "--version").stdout == run(BINARY, "--version").stdout
    proc_args = json.loads((bundle / "config.json").read_text())["process"]["args"]
    assert proc_args[:2] == ["/edgelm", "serve"]
    # The image's own command line, with the model from outside the image and a loopback port.
    port = free_port()
    args = [a for a in proc_args[1:]]
    args[args.index("--model") + 1] = str(MODEL)
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    log = open(d / "serve-amd64.log", "w")
    p = subprocess.Popen([str(rootfs / "edgelm"), *args, "-t", "1", "--kv-memory-mib", "32"],
                         stdout=log, stderr=subprocess.STDOUT, cwd=rootfs)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert p.poll() is None, (d / "serve-amd64.log").read_text()
            time.sleep(0.1)
        r = httpx.post(base + "/v1/completions", timeout=60,
                       json={"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] >= 1
    finally:
        p.terminate()
        assert p.wait(timeout=30) == 0
        log.close()


def test_the_arm64_image_is_the_cuda_build_with_its_own_glibc(image):
    d, (a, _) = image
    bundle = unpack(d, a, "arm64")
    rootfs = bundle / "rootfs"
    exe = rootfs / "edgelm"
    kind = run("file", "-b", exe).stdout
    assert "ARM aarch64" in kind and "dynamically linked" in kind, kind
    assert (rootfs / "lib" / "ld-linux-aarch64.so.1").exists()
    assert (rootfs / "lib" / "aarch64-linux-gnu" / "libc.so.6").exists()
    data = exe.read_bytes()
    # The cuda build dlopens the driver's libcuda and CUDA's libnvrtc (neither is in the image).
    assert b"libcuda.so" in data and b"libnvrtc" in data
    assert not list(rootfs.rglob("libcuda*")) and not list(rootfs.rglob("libnvrtc*"))
    env = json.loads((bundle / "config.json").read_text())["process"]["env"]
    assert any(e.startswith("LD_LIBRARY_PATH=") and "/usr/local/cuda/lib64" in e for e in env), env
    # Runs on the image's own loader and libraries (qemu-user -L: the rootfs as /).
    out = run("qemu-aarch64", "-L", rootfs, exe, "--version", timeout=120).stdout
    assert out == run(AMD64, "--version").stdout
