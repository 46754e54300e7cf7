"""test_ref_v41.py - the DeepSeek-V4.1 self-checks of the Python reference (run by test_ref.py).

Owns: on a random tiny-v41 checkpoint written by tiny_v41.py (no C engine needed):
(0) V4.1's formats (compressed-KV FP4 with e4m3 scales per 16, FP8 weights per 32x32 block);
(1) chunk consistency: logits and DSpark rows with the whole prefill vs token by token vs
other splits; (2) every layer kind does something: zeroing layer 1's Engram table changes
layer 1's streams and nothing before it; layer 3 uses layer 2's selection and reads layer 2's
compressed rows; layer 6 uses layer 5's selection; layer 5 selects only inside layer 4's
candidate blocks, and would select otherwise without them; the DSpark stages read their rings
(main_x) and attend over the whole draft block (not causally); (3) the official decode bug
(docs/MODEL.md §6): the official decode differs from the prefill semantics on ratio-2 layer 2
exactly at a step completing no group; (4) the command line (`logits --dspark-out`).

Why here: test_ref.py is the V4 self-check file; the V4.1 checks share its `check` but not its
checkpoints (`dsv4 gen` cannot write V4.1 yet), so they live apart.
"""

import os
import subprocess
import sys

import numpy as np
import torch

import config as cfgmod
import model as mdl
import model_v41 as mv
import numerics as nx
import st
import tiny_v41
import weights as wmod

HERE = os.path.dirname(os.path.abspath(__file__))


def load(d):
    cfg = cfgmod.load_config(d)
    return mv.ModelV41(cfg, wmod.Weights(d, cfg.weight_block))


def tokens(cfg, T, seed):
    rng = np.random.default_rng(seed)
    return [0] + rng.integers(4, cfg.vocab_size, T - 1).tolist()


def recorded(m, toks, prefill=None):
    rec = mdl.Recorder()
    mv.run(m, toks, prefill, rec=rec)
    return rec.result()


def rel(a, b):
    return float((a - b).norm() / b.norm())


# ----------------------------------------------------------------------------- (0)


def test_formats(check, d):
    print("V4.1 number formats")
    x = nx.bf16(torch.randn(5, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 3)
    y = nx.fp4_sim_e4m3(x, 16).reshape(5, 4, 16)
    s = nx.round_e4m3(nx.f32(x.reshape(5, 4, 16).abs().amax(-1, keepdim=True) / 6))
    check(bool(torch.equal(nx.round_e2m1(y / s), y / s)) and not torch.equal(s, nx.pow2_scale(s, 1.0, 1e-30)),
          "compressed-KV FP4: e2m1 x an e4m3 (not power-of-two) scale per 16")
    w = wmod.Weights(d, 32)
    W, quant = w.dense("layers.0.attn.wq_a")
    blocks = W.reshape(W.shape[0] // 32, 32, W.shape[1] // 32, 32).abs().amax((1, 3))
    sc = nx.e8m0_to_f64(w.stored["layers.0.attn.wq_a.scale"].array)
    check(quant and bool((torch.from_numpy(sc) * 448 >= blocks).all() and (torch.from_numpy(sc) * 224 <= blocks).all()),
          "FP8 weights: one e8m0 scale per 32x32 block")


# ----------------------------------------------------------------------------- (1)


def test_chunks(check, m, toks):
    T = len(toks)
    print(f"V4.1 chunk consistency (tiny-v41, T = {T})")
    ref, (dref, cref) = mv.run(m, toks, None, dspark=True)
    for N in (1, 2, 7, 20):
        a, (da, ca) = mv.run(m, toks, N, dspark=True)
        e = max(rel(a, ref), rel(da, dref), rel(ca, cref))
        print(f"    --prefill {N:2d} vs --prefill {T}: rel L2 logits {rel(a, ref):.3g}, "
              f"DSpark logits {rel(da, dref):.3g}, confidences {rel(ca, cref):.3g}")
        check(e <= 1e-6, f"V4.1: prefill {N} matches prefill {T} (logits, DSpark rows)")
    check(bool(torch.isfinite(ref).all() and torch.isfinite(dref).all() and torch.isfinite(cref).all()),
          "V4.1: logits, DSpark logits and confidences are finite")


# ----------------------------------------------------------------------------- (2)


def first_diff(A, B):
    return next((k for k in A if k in B and not torch.equal(A[k], B[k])), None)


def test_engram(check, d, toks):
    m = load(d)
    A = recorded(m, toks)
    name = "layers.1.engram.embed.weight"
    t = m.w.stored[name]
    m.w.stored[name] = st.StoredTensor(t.dtype, np.zeros_like(t.array))
    B = recorded(m, toks)
    k = first_diff(A, B)
    check(k == "L1.x_engram", f"zeroing layer 1's Engram table: first change at L1.x_engram (found {k})")
    check(not torch.equal(A["L1.x_out"], B["L1.x_out"]), "... and layer 1's output changes")
    check(bool(torch.equal(A["L5.engram_rows"], B["L5.engram_rows"])), "... Engram row ids do not depend on the table")


class NoRowsFor3(mv.ModelV41):
    """Layer 3 sees zeros instead of the compressed rows of its kv source (layer 2)."""

    def comp_rows(self, st_, il):
        rows = super().comp_rows(st_, il)
        return torch.zeros_like(rows) if il == 3 else rows


class NoCandidates(mv.ModelV41):
    """Candidate users score every row (the pre-filter off)."""

    def indexer(self, st_, il, u, qr, pos, sh, rec, tag):
        kind = self.cfg.kinds[il]
        saved, kind.cand = kind.cand, (kind.cand if kind.cand == "source" else None)
        try:
            return super().indexer(st_, il, u, qr, pos, sh, rec, tag)
        finally:
            kind.cand = saved


def test_sharing(check, d, m, toks):
    print("V4.1 layer kinds")
    A = recorded(m, toks)
    check(bool(torch.equal(A["L3.idx_topk"], A["L2.idx_topk"])) and bool(torch.equal(A["L6.idx_topk"], A["L5.idx_topk"])),
          "layer 3 uses layer 2's selection, layer 6 layer 5's")
    compress = sorted(int(k[1:].split(".")[0]) for k in A if k.endswith(".comp"))
    index = sorted(int(k[1:].split(".")[0]) for k in A if k.endswith(".idx_scores"))
    check(compress == [2, 4] and index == [2, 4, 5], f"kv sources {compress} (want [2, 4]), indexers {index} (want [2, 4, 5])")
    cfg = m.cfg
    B = recorded(NoRowsFor3(cfg, wmod.Weights(d, cfg.weight_block)), toks)
    k = first_diff(A, B)
    check(k == "L3.attn_out", f"layer 3 reads layer 2's compressed rows (first change at L3.attn_out, found {k})")
    sel, cand = A["L5.idx_topk"], A["L4.cand"]
    inside = all(bool(cand[i, j]) for i in range(sel.shape[0]) for j in sel[i].tolist() if j >= 0)
    check(inside, "layer 5 selects only rows inside layer 4's candidate blocks")
    C = recorded(NoCandidates(cfg, wmod.Weights(d, cfg.weight_block)), toks)
    check(not torch.equal(C["L5.idx_topk"], sel), "... and selects other rows without the pre-filter")
    print(f"    candidate rows per query at the last position: {int(cand[-1].sum())} of {cand.shape[1]}")


def test_dspark(check, d, toks):
    print("V4.1 DSpark stages")
    m = load(d)
    ref, (dref, cref) = mv.run(m, toks, 5, dspark=True)
    saved = m.cfg.dspark_noise_id
    m.cfg.dspark_noise_id = saved + 1
    _, (dn, _) = mv.run(m, toks, 5, dspark=True)
    m.cfg.dspark_noise_id = saved
    check(not torch.equal(dn[:, 0], dref[:, 0]),
          "draft 0 changes with the noise token of drafts 1.. (attention inside the block is not causal)")
    name = "mtp.0.main_norm.weight"
    t = m.w.stored[name]
    m.w.stored[name] = st.StoredTensor(t.dtype, t.array[::-1].copy())
    m.w._cache.clear()
    a, (dm, _) = mv.run(m, toks, 5, dspark=True)
    check(bool(torch.equal(a, ref)) and not torch.equal(dm, dref),
          "changing main_norm changes the drafts (rings from main_x), not the main logits")


# ----------------------------------------------------------------------------- (3)


def test_decode_bug(check, m, toks):
    print("V4.1 official decode bug (docs/MODEL.md §6)")
    for N, completes in ((20, False), (21, True)):
        prefill = recorded(m, toks[:N + 1], N)
        m.official_decode_keys = True
        try:
            official = recorded(m, toks[:N + 1], N)
        finally:
            m.official_decode_keys = False
        w = prefill["L2.idx_scores"].shape[1]   # the official step may score more (other) rows
        A, B = official["L2.idx_scores"][:, :w], prefill["L2.idx_scores"]
        same_prefill, step_same = torch.equal(A[:N], B[:N]), torch.equal(A[N], B[N])
        what = "completes a group" if completes else "completes no group"
        print(f"    decode step at position {N} ({what}): layer 2's scores "
              f"{'equal' if step_same else 'differ'}; logits rel L2 "
              f"{rel(official['logits'][N:], prefill['logits'][N:]):.3g}")
        check(bool(same_prefill) and step_same == completes,
              f"official decode == prefill semantics at layer 2 iff the step {what} (position {N})")


# ----------------------------------------------------------------------------- (4)


def test_cli(check, d, tmp, m, toks):
    print("V4.1 command line")
    out, dout = os.path.join(tmp, "v41.bin"), os.path.join(tmp, "v41_dspark.bin")
    subprocess.run([sys.executable, os.path.join(HERE, "dsv4_ref.py"), "logits", "--model", d,
                    "--tokens", ",".join(map(str, toks)), "--prefill", "4", "--dspark-out", dout,
                    "--out", out], check=True)
    a, (da, ca) = mv.run(m, toks, 4, dspark=True)
    V, B = m.cfg.vocab_size, m.cfg.dspark_block
    la = torch.from_numpy(np.fromfile(out, "<f4").reshape(-1, V).astype(np.float64))
    ld = torch.from_numpy(np.fromfile(dout, "<f4").reshape(-1, B, V + 1).astype(np.float64))
    f = lambda t: t.to(torch.float32).to(torch.float64)  # noqa: E731
    check(torch.equal(la, f(a)) and ld.shape[0] == len(toks) - 1 and torch.equal(ld[..., :V], f(da))
          and torch.equal(ld[..., V], f(ca)), "logits --dspark-out: [T, V] and [T-1, B, V+1], equal to the run")


def run_all(check, tmp):
    d = tiny_v41.write(os.path.join(tmp, "tiny-v41"), seed=1)
    m = load(d)
    toks = tokens(m.cfg, 40, 11)
    test_formats(check, d)
    test_chunks(check, m, toks)
    test_sharing(check, d, m, toks)
    test_engram(check, d, toks[:24])
    test_dspark(check, d, toks[:16])
    test_decode_bug(check, m, toks)
    test_cli(check, d, tmp, m, toks[:12])
