#!/usr/bin/python3
"""export.py - writes a trained v4.py model as a checkpoint in the official release layout.

Owns: the mapping from training parameters to stored tensors (docs/MODEL.md §R2, §R5.2):
  * FP8 e4m3 + F8_E8M0 scale per 128x128 block: attention wq_a, wq_b, wkv, wo_a, wo_b, the
    indexer's wq_b, the shared expert, the MTP e_proj/h_proj;
  * FP4 e2m1 packed two per I8 (low nibble = even input) + F8_E8M0 per 32 inputs: routed
    experts;
  * BF16: embedding, head, norms, router weight, compressor wkv/wgate/norm, weights_proj;
  * F32: hyper-connection fn/base/scale, attention sinks, router bias, compressor ape;
  * I64: hash-routing tables;
plus config.json (the training config, HF field names), model.safetensors.index.json over
one shard for the globals, one per layer and one for the MTP block (as tools/gen.c does),
tokenizer.json, tokenizer_config.json and generation_config.json.

Quantisation is quant.py's, the same the QAT steps simulated. `--float` stores every
projection as BF16 instead (not the release layout; tools/ref reads it without act_quant):
used to check that v4.py computes what the reference computes.

    export.py --ckpt build-train/final.pt --tokenizer build-train/tokenizer.json --out models/kjv-v4-tiny
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bpe  # noqa: E402
import quant  # noqa: E402
import v4  # noqa: E402


def bf16_bits(x):
    """float32 numpy -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype name, numpy array of the stored element type);
    metadata: optional {str: str}."""
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, dt, arr in tensors:
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)
    return off


def linear_kinds(model):
    """{weight name: "fp8" | "fp4"} for every quantised projection."""
    kinds = {}
    for name, mod in model.named_modules():
        if isinstance(mod, v4.Linear) and mod.kind is not None:
            kinds[name + ".weight"] = mod.kind
    return kinds


def stored_tensors(model, as_float=False):
    """[(name, dtype, array)] in state_dict order, scales right after their weights."""
    kinds = linear_kinds(model)
    out = []
    for name, t in model.state_dict().items():
        t = t.detach().float() if t.is_floating_point() else t.detach()
        base = name[:-len(".weight")] if name.endswith(".weight") else None
        kind = kinds.get(name)
        if kind and not as_float:
            if kind == "fp8":
                q, e = quant.fp8_blocks(t)
                codes, scale = quant.pack_fp8(q.numpy(), e.numpy())
                out += [(name, "F8_E4M3", codes), (base + ".scale", "F8_E8M0", scale)]
            else:
                q, e = quant.fp4_rows(t)
                packed, scale = quant.pack_fp4(q.numpy(), e.numpy())
                out += [(name, "I8", packed), (base + ".scale", "F8_E8M0", scale)]
        elif t.dtype == torch.int64:
            out.append((name, "I64", t.numpy().astype("<i8")))
        elif name.endswith(".weight"):                     # embed, head, norms, gate, compressors
            out.append((name, "BF16", bf16_bits(t.numpy())))
        else:                                              # hc_*, attn_sink, gate.bias, ape
            out.append((name, "F32", t.numpy().astype("<f4")))
    return out


def shard_of(name, n_layers):
    if name.startswith("layers."):
        return 1 + int(name.split(".")[1])
    if name.startswith("mtp."):
        return 1 + n_layers
    return 0


def export(model, cfg_json, tokenizer_path, out_dir, as_float=False):
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(out_dir, f))
    tensors = stored_tensors(model, as_float)
    n_layers = cfg_json["num_hidden_layers"]
    n_shards = 2 + n_layers if model.cfg.n_mtp else 1 + n_layers
    shards = [[] for _ in range(n_shards)]
    for t in tensors:
        shards[shard_of(t[0], n_layers)].append(t)
    wmap, total = {}, 0
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        total += write_safetensors(os.path.join(out_dir, fname), part)
        for name, _, _ in part:
            wmap[name] = fname
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    if tokenizer_path:
        shutil.copyfile(tokenizer_path, os.path.join(out_dir, "tokenizer.json"))
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(bpe.tokenizer_config(), f, indent=2, ensure_ascii=False)
            f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 1.0,
                   "top_p": 1.0}, f, indent=2)
        f.write("\n")
    return len(tensors)


def load_model(ckpt_path):
    """A v4.Model with the weights of a training checkpoint (train.py's format)."""
    ck = torch.load(ckpt_path, map_location="cpu")
    model = v4.Model(v4.Cfg(ck["config"]))
    model.load_state_dict(ck["model"])
    return model, ck


def main():
    p = argparse.ArgumentParser(prog="export.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a train.py checkpoint (.pt)")
    p.add_argument("--tokenizer", help="tokenizer.json to copy beside the weights")
    p.add_argument("--out", required=True)
    p.add_argument("--float", action="store_true", help="BF16 projections (for checking, not the release layout)")
    args = p.parse_args()
    model, ck = load_model(args.ckpt)
    n = export(model, ck["config"], args.tokenizer, args.out, args.float)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"wrote {n} tensors to {args.out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
