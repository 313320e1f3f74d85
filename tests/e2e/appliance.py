"""Shared helpers for the appliance tests (static binaries, .debs, offline bundle).

These tests drive the real build scripts; scripts/build-static.sh runs first when a static
binary is missing (several minutes per arch). EDGELM_SYSTEMD_DIR names the directory with
edgelm.{service,sysusers,tmpfiles,default}; when systemd/ lacks them the tests write minimal
stand-ins under target/pkg-test/systemd/ (never into the source tree).
"""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("EDGELM_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
SYSTEMD_FILES = ("edgelm.service", "edgelm.sysusers", "edgelm.tmpfiles", "edgelm.default")

STAND_INS = {
    "edgelm.service": """[Unit]
Description=edgelm LLM inference server (test stand-in)
After=network.target

[Service]
Type=simple
User=edgelm
Group=edgelm
EnvironmentFile=-/etc/default/edgelm
WorkingDirectory=/var/lib/edgelm
ExecStart=/usr/bin/edgelm serve --config /etc/edgelm/profile.toml
Restart=on-failure

[Install]
WantedBy=multi-user.target
""",
    "edgelm.sysusers": 'u edgelm - "edgelm inference server" /var/lib/edgelm\n',
    "edgelm.tmpfiles": "d /var/lib/edgelm 0750 edgelm edgelm -\nd /var/lib/edgelm/models 0750 edgelm edgelm -\n",
    "edgelm.default": '# Environment for edgelm.service (test stand-in).\nEDGELM_API_KEY=""\n',
}


def systemd_dir() -> Path:
    if "EDGELM_SYSTEMD_DIR" in os.environ:
        return Path(os.environ["EDGELM_SYSTEMD_DIR"])
    real = ROOT / "systemd"
    if all((real / f).is_file() for f in SYSTEMD_FILES):
        return real
    stand_in = ROOT / "target" / "pkg-test" / "systemd"
    stand_in.mkdir(parents=True, exist_ok=True)
    for name, text in STAND_INS.items():
        (stand_in / name).write_text(text)
    return stand_in


def script_env() -> dict:
    env = {**os.environ, "EDGELM_SYSTEMD_DIR": str(systemd_dir())}
    if shutil.which("flock") and Path("/work/cargo.lock").exists():
        env.setdefault("CARGO", "flock /work/cargo.lock cargo")
    return env


def static_binary(arch: str) -> Path:
    path = ROOT / "target" / "static" / arch / "edgelm"
    if not path.exists():
        subprocess.run([str(ROOT / "scripts" / "build-static.sh"), arch], check=True, env=script_env(), cwd=ROOT)
    assert path.exists()
    return path


def cargo_version() -> str:
    for line in (ROOT / "Cargo.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no version in Cargo.toml")
