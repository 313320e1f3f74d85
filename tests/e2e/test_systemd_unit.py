"""The hardened systemd unit: systemd-analyze verifies it and rates its exposure <= 2.0.

Needs systemd-analyze (systemd >= 250 for --offline), the server binary (it goes into a
temporary root at usr/bin/edgelm, because verify checks that ExecStart's program exists).
The sysusers/tmpfiles test needs root (tmpfiles chowns into the temporary root).
"""

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import BINARY, require_binary

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "edgelm.service"
SYSTEMD_UNITS = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
                      if (p / "sysinit.target").exists()), None)
MAX_EXPOSURE = 2.0


def analyze(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze is missing (apt-get install systemd)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A root with the binary at /usr/bin/edgelm, /bin/kill (ExecReload's), the unit in
    /etc/systemd/system and the distribution's units (sysinit.target, network-online.target...)
    it depends on."""
    require_binary()
    assert SYSTEMD_UNITS, "no systemd unit directory with sysinit.target on this machine"
    (tmp_path / "usr/bin").mkdir(parents=True)
    shutil.copy2(BINARY, tmp_path / "usr/bin/edgelm")
    (tmp_path / "bin").mkdir()
    shutil.copy2(Path("/bin/kill"), tmp_path / "bin/kill")
    (tmp_path / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree(SYSTEMD_UNITS, tmp_path / "usr/lib/systemd/system", symlinks=True)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    shutil.copy2(UNIT, tmp_path / "etc/systemd/system/edgelm.service")
    return tmp_path


def test_unit_verifies_without_warnings(fake_root: Path):
    r = analyze("verify", f"--root={fake_root}", "edgelm.service", cwd=fake_root)
    assert r.returncode == 0, r.stdout + r.stderr
    # verify exits 0 on unknown keys and bad values (it only warns): any output is a failure.
    assert (r.stdout + r.stderr).strip() == "", r.stdout + r.stderr


def test_verify_really_checks(fake_root: Path):
    """The check above is not vacuous: a missing binary and a misspelt key are reported."""
    (fake_root / "usr/bin/edgelm").unlink()
    r = analyze("verify", f"--root={fake_root}", "edgelm.service", cwd=fake_root)
    assert r.returncode != 0 and "/usr/bin/edgelm" in r.stderr, r.stderr
    shutil.copy2(BINARY, fake_root / "usr/bin/edgelm")
    unit = fake_root / "etc/systemd/system/edgelm.service"
    unit.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    r = analyze("verify", f"--root={fake_root}", "edgelm.service", cwd=fake_root)
    assert "NoNewPrivilege" in r.stdout + r.stderr


def exposure(unit: Path) -> float:
    r = analyze("security", "--offline=true", "--no-pager", str(unit), cwd=unit.parent)
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", r.stdout)
    assert m, f"no exposure score in:\n{r.stdout}\n{r.stderr}"
    return float(m.group(1))


def test_security_exposure_is_at_most_2(tmp_path: Path):
    score = exposure(UNIT)
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE}"


def test_security_score_reacts_to_weakening(tmp_path: Path):
    """The parsed score is the real one: stripping the hardening makes it much worse."""
    weak = tmp_path / "edgelm.service"
    keep = ("Type=", "ExecStart=", "User=", "Group=", "Description=", "[")
    weak.write_text("\n".join(l for l in UNIT.read_text().splitlines() if l.startswith(keep)) + "\n")
    assert exposure(weak) > exposure(UNIT) + 4.0


def test_unit_matches_the_appliance_contract():
    s = unit_settings()
    assert s["Type"] == ["notify"]
    assert s["ExecStart"] == ["/usr/bin/edgelm serve --config /etc/edgelm/profile.toml"]
    assert s["EnvironmentFile"] == ["-/etc/default/edgelm"]
    # `systemctl reload` is a SIGHUP (a reload without downtime); an exit on a model file
    # changed in place (status 1) is restarted.
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["Restart"] == ["on-failure"]
    assert s["User"] == ["edgelm"]
    assert s["CapabilityBoundingSet"] == [""] and s["AmbientCapabilities"] == [""]
    assert s["ProtectSystem"] == ["strict"] and s["NoNewPrivileges"] == ["yes"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert "/var/lib/edgelm/models" in " ".join(s["ReadOnlyPaths"])
    # systemd must not SIGKILL a drain: TimeoutStopSec exceeds every shipped profile's drain.
    stop = int(s["TimeoutStopSec"][0].removesuffix("s"))
    for profile in (ROOT / "firmware-configs").glob("*.toml"):
        drain = tomllib.loads(profile.read_text()).get("server", {}).get("drain_seconds", 30)
        assert stop > drain, f"{profile.name}: drain_seconds {drain} >= TimeoutStopSec {stop}"


@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles chowns to edgelm: needs root")
def test_sysusers_and_tmpfiles_create_user_and_directories(tmp_path: Path):
    (tmp_path / "etc").mkdir()
    sysusers = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(ROOT / "systemd/edgelm.sysusers")],
                              capture_output=True, text=True)
    assert sysusers.returncode == 0, sysusers.stderr
    passwd = (tmp_path / "etc/passwd").read_text()
    user = next(l.split(":") for l in passwd.splitlines() if l.startswith("edgelm:"))
    uid, gid = int(user[2]), int(user[3])
    assert uid != 0 and user[6] == "/usr/sbin/nologin"
    tmpfiles = subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create",
                               str(ROOT / "systemd/edgelm.tmpfiles")], capture_output=True, text=True)
    assert tmpfiles.returncode == 0, tmpfiles.stderr
    state = (tmp_path / "var/lib/edgelm").stat()
    models = (tmp_path / "var/lib/edgelm/models").stat()
    assert (state.st_uid, state.st_gid, state.st_mode & 0o777) == (uid, gid, 0o750)
    # The service can read models but not write them.
    assert (models.st_uid, models.st_gid, models.st_mode & 0o777) == (0, gid, 0o750)
