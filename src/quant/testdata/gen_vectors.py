#!/usr/bin/env python3
"""Generates vectors.rs: oracle test vectors for src/quant.

Dequantization vectors come from gguf-py (`gguf.quants.dequantize`, numpy
ports of ggml's dequantize_row_*). Quantization vectors: Q8_0, F16 and BF16
from gguf-py's quantizers; Q8_1 and Q8_K (which gguf-py does not implement)
from the numpy transcriptions of ggml's quantize_row_q8_1_ref /
quantize_row_q8_K_ref below.

Usage (from the repo root, in a virtual environment of its own, not the system Python):
    python3 -m venv target/gen-venv && target/gen-venv/bin/pip install gguf numpy
    target/gen-venv/bin/python src/quant/testdata/gen_vectors.py
Output is deterministic for a given numpy/gguf version.
"""
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

rng = np.random.default_rng(20240611)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.rs")

# ggml type -> (values per block, bytes per block, byte offsets of f16 scales)
LAYOUT = {
    T.Q4_0: (32, 18, [0]),
    T.Q4_1: (32, 20, [0, 2]),
    T.Q5_0: (32, 22, [0]),
    T.Q5_1: (32, 24, [0, 2]),
    T.Q8_0: (32, 34, [0]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
}


def sane_scale():
    """A small finite f16 of random sign, as little-endian bytes."""
    v = rng.uniform(0.001, 0.05) * rng.choice([-1.0, 1.0])
    return np.array([v], dtype=np.float16).view(np.uint8)


def quant_row(t, nblocks):
    qk, bb, offs = LAYOUT[t]
    raw = rng.integers(0, 256, size=nblocks * bb, dtype=np.uint8)
    for b in range(nblocks):
        for o in offs:
            raw[b * bb + o : b * bb + o + 2] = sane_scale()
    return raw, nblocks * qk


def hexs(a):
    return np.ascontiguousarray(a).view(np.uint8).tobytes().hex()


def f32_hex(a):
    # 8 hex digits of each f32 bit pattern (what test_util::hex_f32s reads)
    return "".join("%08x" % v for v in np.asarray(a, dtype=np.float32).view(np.uint32).ravel())


dequant = []
for t in LAYOUT:
    nb = 4 if LAYOUT[t][0] == 32 else 2
    for _ in range(2):
        raw, n = quant_row(t, nb)
        want = quants.dequantize(raw.reshape(1, -1), t).reshape(-1)
        assert want.size == n and np.all(np.isfinite(want))
        dequant.append((int(t), n, raw.tobytes().hex(), f32_hex(want)))

# F16: normal, subnormal and large values (no inf/nan).
f16 = np.concatenate([
    rng.standard_normal(40) * 3,
    rng.standard_normal(12) * 1e-6,      # f16 subnormals
    rng.standard_normal(12) * 3e4,       # near the f16 max
]).astype(np.float16)
f16 = f16[np.isfinite(f16)][:64]
assert f16.size == 64
dequant.append((int(T.F16), 64, hexs(f16), f32_hex(quants.dequantize(f16.view(np.uint8).reshape(1, -1), T.F16))))
bf = np.concatenate([rng.standard_normal(48) * 10, rng.standard_normal(16) * 1e30]).astype(np.float32)
bf_bits = (bf.view(np.uint32) >> 16).astype(np.uint16)
dequant.append((int(T.BF16), 64, hexs(bf_bits), f32_hex(quants.dequantize(bf_bits.view(np.uint8).reshape(1, -1), T.BF16))))


def np_roundf(n):
    # C roundf: half away from zero (same helper as gguf.quants)
    a = np.abs(n)
    f = np.floor(a)
    return np.sign(n) * (f + np.floor(2 * (a - f)))


def q8_1_ref(x):
    x = x.reshape(-1, 32).astype(np.float32)
    out = []
    for blk in x:
        amax = np.float32(0)
        for v in blk:
            amax = max(amax, np.abs(v))
        d = np.float32(amax / np.float32(127))
        idd = np.float32(1) / d if d != 0 else np.float32(0)
        qs = np_roundf(blk * idd).astype(np.int8)
        s = np.float32(np.float32(int(qs.astype(np.int32).sum())) * d)
        out.append(np.array([d], np.float16).view(np.uint8).tobytes()
                   + np.array([s], np.float16).view(np.uint8).tobytes() + qs.tobytes())
    return b"".join(out)


def q8_K_ref(x):
    x = x.reshape(-1, 256).astype(np.float32)
    out = []
    for blk in x:
        amax = np.float32(0)
        mx = np.float32(0)
        for v in blk:
            if abs(v) > amax:
                amax, mx = abs(v), v
        if amax == 0:
            out.append(bytes(4 + 256 + 32))
            continue
        iscale = np.float32(np.float32(-127) / mx)
        v = np.rint((iscale * blk).astype(np.float32))  # nearest_int: half to even
        qs = np.minimum(127, v).astype(np.int8)
        bsums = qs.astype(np.int32).reshape(16, 16).sum(axis=1).astype("<i2")
        d = np.float32(np.float32(1) / iscale)
        out.append(np.array([d], "<f4").tobytes() + qs.tobytes() + bsums.tobytes())
    return b"".join(out)


def ties(nvals, big):
    """A block whose largest magnitude is exactly 127 (so the scale is 1)
    and whose other values sit exactly on .5 ties."""
    v = (rng.integers(-100, 100, size=nvals) + 0.5).astype(np.float32)
    v[0] = big
    return v


quant = []
for note, x in [
    ("random", rng.standard_normal(32 * 5).astype(np.float32)),
    ("wide", (rng.standard_normal(32 * 3) * 100).astype(np.float32)),
    ("ties+zero", np.concatenate([ties(32, 127.0), np.zeros(32, np.float32), ties(32, -127.0)])),
]:
    want = quants.quantize(x.reshape(1, -1), T.Q8_0).tobytes()
    quant.append((int(T.Q8_0), note, f32_hex(x), want.hex()))
    quant.append((int(T.Q8_1), note, f32_hex(x), q8_1_ref(x).hex()))
for note, x in [
    ("random", rng.standard_normal(512).astype(np.float32)),
    ("ties+zero", np.concatenate([ties(256, -127.0), np.zeros(256, np.float32), ties(256, 127.0)])),
    ("tiny", (rng.standard_normal(256) * 1e-20).astype(np.float32)),
]:
    quant.append((int(T.Q8_K), note, f32_hex(x), q8_K_ref(x).hex()))
hx = np.concatenate([
    rng.standard_normal(32) * 4,
    rng.standard_normal(16) * 1e-6,
    rng.standard_normal(8) * 7e4,         # some overflow to inf
    [1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-11), 65520.0, 65519.0, 2.0**-25, 3 * 2.0**-26, 0.0],
]).astype(np.float32)
quant.append((int(T.F16), "mixed", f32_hex(hx), hx.astype(np.float16).tobytes().hex()))
bx = np.concatenate([
    rng.standard_normal(48) * 10,
    np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 3.4e38, 1e-40, -0.0, 0.0, 1.0], np.float32),
]).astype(np.float32)
quant.append((int(T.BF16), "mixed", f32_hex(bx), quants.quantize(bx.reshape(1, -1), T.BF16).tobytes().hex()))

with open(OUT, "w") as f:
    f.write("//! Generated by gen_vectors.py from gguf-py %s / numpy %s; do not edit.\n\n"
            % (getattr(quants, "__version__", "") or __import__("importlib.metadata").metadata.version("gguf"), np.__version__))
    f.write("/// A raw row (hex bytes) and its dequantization (hex f32 bit patterns).\n")
    f.write("pub struct Dequant {\n    pub ty: u32,\n    pub n: usize,\n    pub raw: &'static str,\n    pub want: &'static str,\n}\n\n")
    f.write("/// f32 input (hex bit patterns) and the expected quantized bytes (hex).\n")
    f.write("pub struct Quant {\n    pub ty: u32,\n    pub note: &'static str,\n    pub src: &'static str,\n    pub want: &'static str,\n}\n\n")
    f.write("pub const DEQUANT: &[Dequant] = &[\n")
    for ty, n, raw, want in dequant:
        f.write('    Dequant {\n        ty: %d,\n        n: %d,\n        raw: "%s",\n        want: "%s",\n    },\n' % (ty, n, raw, want))
    f.write("];\n\npub const QUANT: &[Quant] = &[\n")
    for ty, note, src, want in quant:
        f.write('    Quant {\n        ty: %d,\n        note: "%s",\n        src: "%s",\n        want: "%s",\n    },\n' % (ty, note, src, want))
    f.write("];\n")
print("wrote", OUT, os.path.getsize(OUT), "bytes")
