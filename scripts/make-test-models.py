#!/usr/bin/env python3
"""Makes one test GGUF per architecture from the reference model's tensors (SmolLM2-135M,
Q4_1): the same weights re-laid and re-labelled as llama.cpp's converter would write each
family, with the parts the family adds (biases, Q/K norms, fused tensors, RoPE factors,
scales) filled with small deterministic values. They are not good language models; they are
models whose every part matters, run by edgelm and by llama.cpp on the same file.

    scripts/make-test-models.py SOURCE.gguf OUT_DIR [ARCH...]

Needs the PyPI package `gguf` (tests/e2e/requirements.txt pins it).
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

ARCHS = ["llama", "qwen2", "qwen3", "phi3", "smollm3", "granite"]


def rng_for(name):
    # Deterministic per tensor name, independent of numpy's global state.
    seed = sum((i + 1) * ord(c) for i, c in enumerate(name)) % (2**32)
    return np.random.default_rng(seed)


def field_value(field):
    """(value, type, sub_type) of a reader field, as GGUFWriter.add_key_value takes them."""
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        return vals, vtype, sub
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8"), vtype, None
    return field.parts[field.data[0]].tolist()[0], vtype, None


def make(src, out_dir, arch):
    r = GGUFReader(src)
    old = r.fields["general.architecture"].contents()
    path = os.path.join(out_dir, f"test-{arch}.gguf")
    w = GGUFWriter(path, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        val, vtype, sub = field_value(field)
        if key.startswith(old + "."):
            key = arch + key[len(old):]
        if key == "general.name":
            # Not naming the family: llama.cpp special-cases vocabularies by model name
            # ("phi3" there means a Phi-3 vocabulary, which this one is not).
            val = "edgelm test model"
        w.add_key_value(key, val, vtype, sub)

    n_embd = r.fields[f"{old}.embedding_length"].contents()
    n_head = r.fields[f"{old}.attention.head_count"].contents()
    head_dim = n_embd // n_head
    tensors = {t.name: t for t in r.tensors}
    n_layers = r.fields[f"{old}.block_count"].contents()

    def raw(name):
        t = tensors[name]
        return np.array(t.data), t.tensor_type, [int(d) for d in reversed(t.shape)]

    def put(name, data, ttype, shape):
        if ttype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w.add_tensor(name, data.reshape(shape))
        else:
            # Quantized data is (rows, bytes per row); fused tensors stack rows.
            w.add_tensor(name, data.reshape(shape[0], -1), raw_dtype=ttype)

    def vec(name, n, center, spread):
        v = (center + spread * rng_for(name).standard_normal(n)).astype(np.float32)
        w.add_tensor(name, v)

    for name, t in tensors.items():
        data, ttype, shape = raw(name)
        parts = name.split(".")
        layer = int(parts[1]) if parts[0] == "blk" else None
        if arch == "phi3" and layer is not None:
            # Fused QKV and gate/up, gate rows first (llama.cpp splits ffn_up in halves).
            if parts[2] in ("attn_k", "attn_v", "ffn_gate"):
                continue
            if parts[2] == "attn_q":
                qkv = [raw(f"blk.{layer}.{p}.weight") for p in ("attn_q", "attn_k", "attn_v")]
                fused = np.concatenate([q[0] for q in qkv], axis=0)
                rows = sum(q[2][0] for q in qkv)
                put(f"blk.{layer}.attn_qkv.weight", fused, ttype, [rows, shape[1]])
                continue
            if parts[2] == "ffn_up":
                gate = raw(f"blk.{layer}.ffn_gate.weight")
                fused = np.concatenate([gate[0], data], axis=0)
                put(name, fused, ttype, [2 * shape[0], shape[1]])
                continue
        put(name, data, ttype, shape)
        if layer is None:
            continue
        if arch == "qwen2" and parts[2] in ("attn_q", "attn_k", "attn_v"):
            vec(f"blk.{layer}.{parts[2]}.bias", shape[0], 0.0, 0.05)
        if arch == "qwen3" and parts[2] == "attn_q":
            vec(f"blk.{layer}.attn_q_norm.weight", head_dim, 1.0, 0.1)
            vec(f"blk.{layer}.attn_k_norm.weight", head_dim, 1.0, 0.1)

    if arch == "llama":
        # Llama 3.1's per-pair RoPE frequency factors and an untied output matrix.
        vec("rope_freqs.weight", head_dim // 2, 1.5, 0.4)
        data, ttype, shape = raw("token_embd.weight")
        put("output.weight", data, ttype, shape)
    if arch == "phi3":
        vec("rope_factors_long.weight", head_dim // 2, 2.0, 0.3)
        vec("rope_factors_short.weight", head_dim // 2, 1.2, 0.1)
        w.add_string("phi3.rope.scaling.type", "longrope")
        w.add_float32("phi3.rope.scaling.attn_factor", 1.19)
        w.add_uint32("phi3.rope.scaling.original_context_length", 4096)
    if arch == "granite":
        # Mild scales: every one changes the output, none flattens it to noise.
        w.add_float32("granite.embedding_scale", 1.25)
        w.add_float32("granite.residual_scale", 0.9)
        w.add_float32("granite.attention.scale", 0.11)
        w.add_float32("granite.logit_scale", 1.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, out_dir = sys.argv[1:3]
    archs = sys.argv[3:] or ARCHS
    os.makedirs(out_dir, exist_ok=True)
    for arch in archs:
        if arch not in ARCHS:
            sys.exit(f"unknown architecture {arch} (known: {', '.join(ARCHS)})")
        print(make(src, out_dir, arch))


if __name__ == "__main__":
    main()
