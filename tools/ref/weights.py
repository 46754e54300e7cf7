"""weights.py - checkpoint tensors, decoded to float64 torch tensors on first use.

Owns: turning the stored formats of the official layout (docs/MODEL.md §R2, §R5.2) into exact
float64 values: BF16 -> value; F8_E4M3 weight x scale per 128x128 block (V4; 32x32 for
V4.1, `block`); I8-packed FP4 e2m1
(low nibble = even input index) x scale per 32 inputs of a row; F32 as is; I64 hash tables.
Scales may be F8_E8M0 (2^(e-127)) or F32 (base checkpoints). Decoding is lazy and cached, so
only the experts a run actually routes to are ever expanded.

Why here: the forward (model.py) asks for "layers.3.attn.wq_a" and gets the effective matrix
the demo multiplies by; the one place where the demo itself rounds a weight (wo_a, which
convert.py dequantises to bf16 for a bf16 einsum) is `dense(..., round_bf16=True)`.
"""

import numpy as np
import torch

import numerics as nx
import st


class Weights:
    def __init__(self, model_dir, block=128):
        self.model_dir = model_dir
        self.block = block                 # FP8 weights: one scale per block x block
        self.stored = st.read_checkpoint(model_dir)
        self._cache = {}

    def has(self, name):
        return name in self.stored

    def names(self):
        return self.stored.keys()

    def _scale(self, name):
        t = self.stored[name]
        if t.dtype == "F8_E8M0":
            return nx.e8m0_to_f64(t.array)
        if t.dtype == "F32":
            return t.array.astype(np.float64)
        raise ValueError(f"{name}: scale dtype {t.dtype} (expected F8_E8M0 or F32)")

    def tensor(self, name):
        """A plain tensor (BF16, F32, I64, ...) as float64 (or int64 for integer types)."""
        if name in self._cache:
            return self._cache[name]
        t = self.stored[name]
        if t.dtype == "BF16":
            v = nx.bf16_bits_to_f64(t.array)
        elif t.dtype in ("F32", "F64", "F16"):
            v = torch.from_numpy(t.array.astype(np.float64))
        elif t.dtype in ("I64", "I32", "I16", "I8", "U8"):
            v = torch.from_numpy(t.array.astype(np.int64))
        else:
            raise ValueError(f"{name}: dtype {t.dtype} is not a plain tensor")
        self._cache[name] = v
        return v

    def dense(self, prefix, round_bf16=False):
        """The effective weight matrix [out, in] of linear `prefix` (prefix.weight and, when
        quantised, prefix.scale), as float64. Also returns whether the linear is quantised
        (FP8 or FP4: its input is then act-quantised, see model.linear)."""
        key = (prefix, round_bf16)
        if key in self._cache:
            return self._cache[key]
        w = self.stored[prefix + ".weight"]
        if w.dtype == "F8_E4M3":
            s = self._scale(prefix + ".scale")
            out, inp = w.array.shape
            b = self.block
            full = np.repeat(np.repeat(s, b, axis=0), b, axis=1)[:out, :inp]
            m = torch.from_numpy(nx.e4m3_to_f64(w.array) * full)
            quant = True
        elif w.dtype == "I8":
            s = self._scale(prefix + ".scale")
            vals = nx.e2m1_packed_to_f64(w.array)
            full = np.repeat(s, 32, axis=1)
            if full.shape != vals.shape:
                raise ValueError(f"{prefix}: FP4 scale shape {s.shape} does not match weight {vals.shape}")
            m = torch.from_numpy(vals * full)
            quant = True
        elif w.dtype in ("BF16", "F32"):
            m = self.tensor(prefix + ".weight")
            quant = False
        else:
            raise ValueError(f"{prefix}.weight: unsupported dtype {w.dtype}")
        if round_bf16:
            m = nx.bf16(m)
        self._cache[key] = (m, quant)
        return self._cache[key]

    def rows_fp8(self, prefix, idx):
        """Rows idx (int64 tensor, any shape) of an FP8 table with an e8m0 scale per 32 values
        of a row (prefix.weight [rows, d] F8_E4M3, prefix.scale [rows, d/32]; the V4.1 Engram
        tables, `ParallelEngramEmbedding`): float64 [..., d], only those rows decoded."""
        w, s = self.stored[prefix + ".weight"].array, self._scale(prefix + ".scale")
        flat = idx.reshape(-1).numpy()
        vals = nx.e4m3_to_f64(w[flat]) * np.repeat(s[flat], 32, axis=1)
        return torch.from_numpy(vals).reshape(*idx.shape, w.shape[1])
