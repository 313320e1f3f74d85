"""The static (musl) binaries: statically linked, and they run (arm64 under qemu-user)."""

import shutil
import subprocess

import pytest

from appliance import MODEL, cargo_version, static_binary

ARCHES = ("amd64", "arm64")


def runner(arch: str) -> list[str]:
    if arch == "arm64":
        qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
        if qemu is None:
            pytest.skip("qemu-aarch64 not installed (apt-get install qemu-user)")
        return [qemu, "-cpu", "max"]
    return []


@pytest.mark.parametrize("arch", ARCHES)
def test_statically_linked(arch):
    binary = static_binary(arch)
    desc = subprocess.run(["file", "-L", str(binary)], capture_output=True, text=True, check=True).stdout
    assert ("statically linked" in desc) or ("static-pie linked" in desc), desc
    assert "dynamically linked" not in desc and "interpreter" not in desc, desc
    assert {"amd64": "x86-64", "arm64": "ARM aarch64"}[arch] in desc, desc
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    out = ldd.stdout + ldd.stderr
    # glibc's ldd: "not a dynamic executable" (static) or "statically linked" (static-pie).
    assert "not a dynamic executable" in out or "statically linked" in out, out
    assert "=>" not in out, out


@pytest.mark.parametrize("arch", ARCHES)
def test_version(arch):
    out = subprocess.run([*runner(arch), str(static_binary(arch)), "--version"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == f"edgelm {cargo_version()}"


@pytest.mark.parametrize("arch", ARCHES)
def test_short_generation(arch):
    assert MODEL.exists(), f"{MODEL} missing: run packaging/fetch-model.sh"
    proc = subprocess.run([*runner(arch), str(static_binary(arch)), "run", "-m", str(MODEL), "-p", "Hello",
                           "-n", "8", "--temp", "0", "--ignore-eos", "-t", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), proc.stderr
    assert "generated: 8 tokens" in proc.stderr, proc.stderr


def test_same_greedy_text_on_both_arches():
    """Greedy decoding is deterministic enough on this tiny prompt that both ISAs agree."""
    outs = []
    for arch in ARCHES:
        proc = subprocess.run([*runner(arch), str(static_binary(arch)), "run", "-m", str(MODEL), "-p",
                               "The capital of France is", "-n", "4", "--temp", "0", "--ignore-eos", "-t", "1"],
                              capture_output=True, text=True, timeout=300, check=True)
        outs.append(proc.stdout)
    assert outs[0] == outs[1], outs
