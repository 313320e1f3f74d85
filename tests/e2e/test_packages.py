"""The .deb packages: lintian clean of errors, expected contents and conffiles, installable."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance import ROOT, cargo_version, script_env, static_binary

ARCHES = ("amd64", "arm64")
EXPECTED_FILES = {
    "./usr/bin/edgelm",
    "./lib/systemd/system/edgelm.service",
    "./usr/lib/sysusers.d/edgelm.conf",
    "./usr/lib/tmpfiles.d/edgelm.conf",
    "./etc/default/edgelm",
    "./etc/edgelm/profile.toml",
    "./usr/share/doc/edgelm/copyright",
    "./usr/share/doc/edgelm/changelog.Debian.gz",
    "./usr/share/man/man1/edgelm.1.gz",
}


@pytest.fixture(scope="module")
def debs() -> dict:
    out = {}
    for arch in ARCHES:
        static_binary(arch)
        proc = subprocess.run([str(ROOT / "scripts" / "package-deb.sh"), arch], capture_output=True, text=True,
                              env=script_env(), cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        out[arch] = ROOT / proc.stdout.strip().splitlines()[-1]
        assert out[arch].exists()
    return out


def field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("arch", ARCHES)
def test_control(debs, arch):
    deb = debs[arch]
    assert field(deb, "Package") == "edgelm"
    assert field(deb, "Version").startswith(cargo_version() + "-")
    assert field(deb, "Architecture") == arch
    assert field(deb, "Depends") == ""
    for name in ("Maintainer", "Description", "Section", "Priority"):
        assert field(deb, name), name


@pytest.mark.parametrize("arch", ARCHES)
def test_contents_and_conffiles(debs, arch, tmp_path):
    deb = debs[arch]
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    entries = {}
    for line in listing.splitlines():
        parts = line.split()
        entries[parts[5]] = (parts[0], parts[1])
    profiles = sorted(p.name for p in (ROOT / "firmware-configs").glob("*.toml"))
    expected = EXPECTED_FILES | {f"./etc/edgelm/profiles/{p}" for p in profiles}
    assert expected <= set(entries), expected - set(entries)
    assert entries["./usr/bin/edgelm"][0] == "-rwxr-xr-x"
    assert all(owner == "root/root" for _, owner in entries.values())

    subprocess.run(["dpkg-deb", "--control", str(deb), str(tmp_path / "ctl")], check=True)
    conffiles = set((tmp_path / "ctl" / "conffiles").read_text().split())
    etc_files = {p[1:] for p, (mode, _) in entries.items() if p.startswith("./etc/") and mode.startswith("-")}
    assert conffiles == etc_files
    for script in ("postinst", "prerm", "postrm"):
        assert os.access(tmp_path / "ctl" / script, os.X_OK), script


@pytest.mark.parametrize("arch", ARCHES)
def test_lintian_has_no_errors(debs, arch):
    if shutil.which("lintian") is None:
        pytest.skip("lintian not installed (apt-get install lintian)")
    proc = subprocess.run(["lintian", "--tag-display-limit", "0", str(debs[arch])], capture_output=True, text=True)
    errors = [line for line in proc.stdout.splitlines() if line.startswith("E:")]
    assert not errors, proc.stdout
    assert proc.returncode in (0, 1) and "error" not in proc.stderr.lower(), proc.stderr


def test_install_into_fresh_root(debs, tmp_path):
    """dpkg installs the amd64 deb into an empty root; the maintainer scripts run there."""
    root = tmp_path / "root"
    admin = root / "var" / "lib" / "dpkg"
    for d in ("updates", "info", "triggers"):
        (admin / d).mkdir(parents=True)
    (admin / "status").write_text("")
    (admin / "available").write_text("")
    # The empty root has no shell to chroot the maintainer scripts into; they run chrootless
    # and honour DPKG_ROOT (dpkg sets it), so nothing outside ROOT changes.
    dpkg = ["dpkg", f"--root={root}", "--force-not-root", "--force-script-chrootless", "--log=/dev/null"]
    proc = subprocess.run([*dpkg, "-i", str(debs["amd64"])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no model at '/var/lib/edgelm/models/" in proc.stderr, proc.stderr
    status = (admin / "status").read_text()
    assert "Package: edgelm" in status and "Status: install ok installed" in status
    binary = root / "usr" / "bin" / "edgelm"
    assert binary.exists() and os.access(binary, os.X_OK)
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"edgelm {cargo_version()}"
    profile = (root / "etc" / "edgelm" / "profile.toml").read_text()
    assert 'path = "/var/lib/edgelm/models/' in profile
    check = subprocess.run([str(binary), "config", "check", str(root / "etc" / "edgelm" / "profile.toml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for p in EXPECTED_FILES:
        assert (root / p).exists(), p
    assert (root / "var" / "lib" / "edgelm" / "models").is_dir() or shutil.which("systemd-tmpfiles") is None
    if shutil.which("systemd-sysusers"):
        assert "edgelm:" in (root / "etc" / "passwd").read_text()
    if shutil.which("systemctl"):
        assert (root / "etc" / "systemd" / "system" / "multi-user.target.wants" / "edgelm.service").is_symlink()

    # A model dropped into the state directory survives remove; purge deletes it and /etc/edgelm.
    (root / "var" / "lib" / "edgelm" / "models").mkdir(parents=True, exist_ok=True)
    (root / "var" / "lib" / "edgelm" / "models" / "m.gguf").write_text("x")
    proc = subprocess.run([*dpkg, "--remove", "edgelm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not binary.exists()
    assert (root / "etc" / "edgelm" / "profile.toml").exists()
    assert (root / "var" / "lib" / "edgelm" / "models" / "m.gguf").exists()
    proc = subprocess.run([*dpkg, "--purge", "edgelm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (root / "etc" / "edgelm" / "profile.toml").exists()
    assert not (root / "var" / "lib" / "edgelm").exists()
