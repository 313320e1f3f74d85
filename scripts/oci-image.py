#!/usr/bin/env python3
"""Writes an OCI image layout (image-spec v1.1) with one index over per-platform images, and
packs it as an uncompressed tar (what `skopeo ... oci-archive:` and k3s/containerd
`ctr images import` read). No container daemon, no network, standard library only.

  scripts/oci-image.py --out target/image/edgelm-oci.tar --tag 0.1.0 \
      --image linux/amd64=target/image/rootfs-amd64 \
      --image linux/arm64/v8=target/image/rootfs-arm64 --env linux/arm64/v8:KEY=VALUE

Each ROOTFS directory becomes one gzip layer (files sorted, uid/gid 0, mtime 0: the same inputs
give the same digests). Every image has entrypoint /edgelm and a `serve` command that binds all
interfaces and reads the model from /models/model.gguf (a hostPath or volume: the model is never
in the image)."""

import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CMD = ["serve", "--host", "0.0.0.0", "--port", "8080", "--model", "/models/model.gguf"]


class Layout:
    def __init__(self):
        self.blobs: dict[str, bytes] = {}

    def add(self, data: bytes, media_type: str, **extra) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}


def layer_tar(rootfs: Path) -> bytes:
    """The directory as a tar with normalised metadata (root-owned, mtime 0, sorted)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = sorted(p for p in rootfs.rglob("*"))
        for p in paths:
            rel = p.relative_to(rootfs).as_posix()
            info = tar.gettarinfo(str(p), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                info.mode = 0o755 if os.access(p, os.X_OK) else 0o644
                with open(p, "rb") as f:
                    tar.addfile(info, f)
            else:
                if info.isdir():
                    info.mode = 0o755
                tar.addfile(info)
    return buf.getvalue()


def image(layout: Layout, platform: str, rootfs: Path, env: list[str], tag: str) -> dict:
    parts = platform.split("/")
    os_, arch = parts[0], parts[1]
    variant = parts[2] if len(parts) > 2 else None
    raw = layer_tar(rootfs)
    gz = gzip.compress(raw, compresslevel=9, mtime=0)
    layer = layout.add(gz, MT_LAYER)
    config = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": arch,
        "os": os_,
        **({"variant": variant} if variant else {}),
        "config": {
            "Entrypoint": ["/edgelm"],
            "Cmd": CMD,
            "Env": ["PATH=/", *env],
            "ExposedPorts": {"8080/tcp": {}},
            "WorkingDir": "/",
            "StopSignal": "SIGTERM",
            "Labels": {"org.opencontainers.image.title": "edgelm",
                       "org.opencontainers.image.version": tag},
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "scripts/build-image.sh"}],
    }
    cfg = layout.add(json.dumps(config, indent=2, sort_keys=True).encode(), MT_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": cfg, "layers": [layer],
                "annotations": {"org.opencontainers.image.version": tag}}
    plat = {"architecture": arch, "os": os_, **({"variant": variant} if variant else {})}
    return layout.add(json.dumps(manifest, indent=2, sort_keys=True).encode(), MT_MANIFEST, platform=plat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--name", default="docker.io/library/edgelm",
                    help="image name for the index annotation containerd/k3s import under")
    ap.add_argument("--image", action="append", required=True,
                    help="PLATFORM=ROOTFS (PLATFORM like linux/arm64/v8)")
    ap.add_argument("--env", action="append", default=[], help="PLATFORM:KEY=VALUE, repeatable")
    args = ap.parse_args()

    layout = Layout()
    manifests = []
    for spec in args.image:
        platform, rootfs = spec.split("=", 1)
        env = [e.split(":", 1)[1] for e in args.env if e.split(":", 1)[0] == platform]
        manifests.append(image(layout, platform, Path(rootfs), env, args.tag))
    index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": manifests}
    index_blob = layout.add(json.dumps(index, indent=2, sort_keys=True).encode(), MT_INDEX)
    # The layout's own index.json points at the multi-platform index under the tag, so that
    # `oci-archive:edgelm-oci.tar:TAG` (skopeo, umoci) and containerd's import both find it.
    top = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [
        {**index_blob, "annotations": {"org.opencontainers.image.ref.name": args.tag,
                                       "io.containerd.image.name": f"{args.name}:{args.tag}"}}]}

    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        def put(name: str, data: bytes):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        put("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        put("index.json", json.dumps(top, indent=2, sort_keys=True).encode())
        for digest in sorted(layout.blobs):
            put("blobs/sha256/" + digest.split(":", 1)[1], layout.blobs[digest])
    tmp.replace(args.out)
    for m in manifests:
        p = m["platform"]
        print(f"    {p['os']}/{p['architecture']}{'/' + p['variant'] if 'variant' in p else ''}: {m['digest']}")
    print(f"    {args.out} ({args.out.stat().st_size // 1024} KiB), tag {args.tag}")


if __name__ == "__main__":
    main()
