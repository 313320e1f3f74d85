"""A GGUF file with one more u32 metadata key: the header is re-written, tensor infos and
data are copied (their offsets are relative to the aligned data section, so they hold)."""

import struct
from pathlib import Path

# GGUF value types: sizes of the fixed-width ones (8 is a string, 9 an array).
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
U32 = 4


def _skip_value(buf: bytes, pos: int, ty: int) -> int:
    if ty in FIXED:
        return pos + FIXED[ty]
    if ty == 8:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if ty == 9:
        inner, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if inner in FIXED:
            return pos + FIXED[inner] * n
        for _ in range(n):
            pos = _skip_value(buf, pos, inner)
        return pos
    raise ValueError(f"GGUF value type {ty}")


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8:pos + 8 + n].decode(), pos + 8 + n


def with_u32_key(source: Path, dest: Path, key: str, value: int) -> Path:
    """`source` with `key` = `value` (u32) added (the key must not be there already)."""
    buf = source.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF" and version == 3, "a GGUF v3 file"
    pos, alignment = 24, 32
    kv_start = pos
    for _ in range(n_kv):
        name, pos = _string(buf, pos)
        assert name != key, f"{source} already has {key}"
        (ty,) = struct.unpack_from("<I", buf, pos)
        if name == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, pos + 4)
        pos = _skip_value(buf, pos + 4, ty)
    kv_end = pos
    for _ in range(n_tensors):
        _, pos = _string(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * n_dims + 4 + 8
    infos_end = pos
    data_start = -(-infos_end // alignment) * alignment
    encoded = key.encode()
    new_kv = struct.pack("<Q", len(encoded)) + encoded + struct.pack("<II", U32, value)
    head = struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + 1)
    head += buf[kv_start:kv_end] + new_kv + buf[kv_end:infos_end]
    head += b"\0" * (-len(head) % alignment)
    dest.write_bytes(head + buf[data_start:])
    return dest
