#!/usr/bin/python3
"""test_ref.py - self-checks of the Python reference, with the figures the issue asks for.

Owns: (1) number-format checks (e4m3/e2m1 round-to-nearest-even with saturation, ue8m0
scales, bf16 rounding, FP4 nibble order, Hadamard); (2) safetensors round trip through the
writer; (3) chunk consistency: logits (and MTP logits) with --prefill T vs --prefill 1 and
other splits, for tiny-a and tiny-b: relative L2 (median, overall) and argmax agreement;
(4) revisions: `current` and `initial` differ exactly where docs/MODEL.md §R0 says (cached-KV
FP8 simulation, shared-expert clamp) and nowhere else; (5) the command line; and, with
--noise, (6) the noise floor engines doing f32 arithmetic will show against the fixtures
(dot products accumulated in f32; every rounding point's input off by < 1 f32 ulp);
(7) the DeepSeek-V4.1 checks of test_ref_v41.py on a random tiny-v41 checkpoint (chunk
consistency, each layer kind's effect, the official decode bug, `logits --dspark-out`).

Why here: the reference is the project's ground truth; these checks are what makes it
trustworthy, and their printed figures are quoted in tests/golden/README.md.

Usage: /usr/bin/python3 tools/ref/test_ref.py [--dsv4 PATH] [--noise] [--v41-only]
V4 checkpoints are generated with `dsv4 gen` into a temporary directory (--v41-only skips the
V4 checks and needs no dsv4 binary); the V4.1 one with tiny_v41.py.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import config as cfgmod  # noqa: E402
import model as mdl  # noqa: E402
import numerics as nx  # noqa: E402
import st  # noqa: E402
import test_ref_v41  # noqa: E402
import weights as wmod  # noqa: E402

FAILS = []


def check(ok, what):
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        FAILS.append(what)


def compare(a, b):
    """(median rel L2 per row, overall rel L2, argmax agreement) of a against reference b."""
    rel = (a - b).norm(dim=1) / b.norm(dim=1)
    return float(rel.median()), float((a - b).norm() / b.norm()), float((a.argmax(1) == b.argmax(1)).double().mean())


def fmt(c):
    return f"median rel L2 {c[0]:.3g}, overall {c[1]:.3g}, argmax agreement {c[2]:.4f}"


# ----------------------------------------------------------------------------- numerics


def test_numerics():
    print("number formats")
    pos = nx.E4M3_TABLE[:127]
    mids = torch.tensor((pos[:-1] + pos[1:]) / 2)
    r = nx.round_e4m3(mids)
    lo, hi = torch.tensor(pos[:-1]), torch.tensor(pos[1:])
    even_lo = torch.arange(126) % 2 == 0
    check(bool(torch.equal(r, torch.where(even_lo, lo, hi))), "e4m3: midpoints round to the even code")
    eps = 1e-9
    check(bool(torch.equal(nx.round_e4m3(mids + eps * hi), hi)) and bool(torch.equal(nx.round_e4m3(mids - eps * hi), lo)),
          "e4m3: just above/below a midpoint rounds up/down")
    check(bool(torch.equal(nx.round_e4m3(torch.tensor([500.0, -1e6, 448.0, 2.0 ** -10, 2.0 ** -9 * 1.5, -0.0])),
                           torch.tensor([448.0, -448.0, 448.0, 0.0, 2.0 ** -8, 0.0]))),
          "e4m3: saturation at 448, subnormals, ties at the bottom")
    check(bool(torch.equal(nx.round_e2m1(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -5.0, 0.26])),
                           torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -4.0, 0.5]))),
          "e2m1: ties to even, saturation at 6")
    s = nx.pow2_scale(torch.tensor([448.0, 449.0, 1e-9, 224.0, 300.0]), 448.0, 1e-4)
    check(bool(torch.equal(s, torch.tensor([1.0, 2.0, 2.0 ** -22, 0.5, 1.0], dtype=torch.float64))),
          "ue8m0 activation scale = 2^ceil(log2(amax/448)), amax floor 1e-4")
    x = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -30], dtype=torch.float64)
    check(bool(torch.equal(nx.bf16(x), torch.tensor([1.0, 1 + 2 ** -6, 1.0], dtype=torch.float64))),
          "bf16: nearest-even, via f32 (double rounding as the demo's f32 -> bf16)")
    packed = np.array([[0x21, 0xF7]], dtype=np.uint8).view(np.int8)
    check(np.array_equal(nx.e2m1_packed_to_f64(packed), [[0.5, 1.0, 6.0, -6.0]]), "FP4: low nibble = even input index")
    H = nx.hadamard_matrix(128)
    check(bool(torch.allclose(H @ H.T, torch.eye(128, dtype=torch.float64))) and float(H[3, 5]) < 0 and float(H[1, 2]) > 0,
          "Hadamard: orthonormal Sylvester order, H[i][j] = (-1)^popcount(i&j)")
    blk = nx.fp8_sim(nx.bf16(torch.randn(3, 128, dtype=torch.float64)), 64).reshape(3, 2, 64)
    sc = nx.pow2_scale(blk.abs().amax(-1, keepdim=True), 448.0, 1e-4)
    check(bool(torch.equal(nx.round_e4m3(blk / sc), blk / sc)), "KV FP8 simulation lands on e4m3 x 2^k per 64 block")


def test_safetensors(tmp):
    print("safetensors writer/reader")
    path = os.path.join(tmp, "rt.safetensors")
    t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], dtype=np.int32),
         "c": np.ones((1, 1, 4), dtype=np.float16)}
    st.write_file(path, t, {"k": "v"})
    back, meta = st.read_file(path)
    check(meta == {"k": "v"} and all(np.array_equal(back[k].array, v) for k, v in t.items()),
          "round trip of F32/I32/F16 tensors and metadata")


# ----------------------------------------------------------------------------- the model


def gen(dsv4, tmp, name, args):
    d = os.path.join(tmp, name)
    if not os.path.exists(d):
        subprocess.run([dsv4, "gen", "-q", "-o", d] + args, check=True)
    return d


def load(d, rev="current", **kw):
    return mdl.Model(cfgmod.load_config(d), wmod.Weights(d), cfgmod.Revision(rev, **kw))


def tokens(cfg, T, seed):
    rng = np.random.default_rng(seed)
    return [0] + rng.integers(2, cfg.vocab_size, T - 1).tolist()


def test_consistency(d, name, T, splits):
    print(f"chunk consistency, {name} (T = {T})")
    m = load(d)
    toks = tokens(m.cfg, T, 7)
    ref, mref = mdl.run(m, toks, T, mtp=True)
    for N in splits:
        a, ma = mdl.run(m, toks, N, mtp=True)
        c, cm = compare(a, ref), compare(ma, mref)
        print(f"    --prefill {N:3d} vs --prefill {T}: logits {fmt(c)}; MTP {fmt(cm)}")
        check(c[1] <= 1e-6 and cm[1] <= 1e-6, f"{name}: prefill {N} matches prefill {T}")
    return m, toks


class CountingModel(mdl.Model):
    """Counts shared-expert elements a clamp at swiglu_limit would change."""

    fires = 0

    def expert(self, x, prefix, limit, weight=None):
        if prefix.endswith("shared_experts") and self.cfg.swiglu_limit > 0:
            lim = self.cfg.swiglu_limit
            g, v = self.linear(x, prefix + ".w1"), self.linear(x, prefix + ".w3")
            CountingModel.fires += int((v.abs() > lim).sum() + (g > lim).sum())
        return super().expert(x, prefix, limit, weight)


def test_revisions(d_default, d_limit, toks):
    print("revisions: current vs initial")
    cur, ini = load(d_default, "current"), load(d_default, "initial")
    rc, ri = mdl.Recorder(), mdl.Recorder()
    mdl.run(cur, toks[:40], 30, mtp=True, rec=rc)
    mdl.run(ini, toks[:40], 30, mtp=True, rec=ri)
    A, B = rc.result(), ri.result()
    order = list(A.keys())
    first = next(k for k in order if not torch.equal(A[k], B[k]))
    check(first == "L0.kv", f"first stage that differs is L0.kv (found {first})")
    N = cur.cfg.nope_head_dim
    check(bool(torch.equal(A["L0.kv"][:, N:], B["L0.kv"][:, N:])), "L0.kv: RoPE dims identical in both revisions")
    check(bool(torch.equal(A["L0.kv"][:, :N], nx.fp8_sim(B["L0.kv"][:, :N], 64))),
          "L0.kv: current nope dims = e4m3 simulation (blocks of 64) of the initial ones")
    frac = float((A["L0.kv"][:, :N] != B["L0.kv"][:, :N]).double().mean())
    print(f"    fraction of L0.kv nope values the FP8 simulation changes: {frac:.3f}")
    check(frac > 0.5, "the FP8 simulation really rounds in `current` (no-op in `initial`)")

    # The switches one at a time, on a checkpoint whose shared expert never reaches the limit
    # (default swiglu_limit 10) and on one where it does (0.5).
    for d, label in ((d_default, "swiglu_limit 10"), (d_limit, "swiglu_limit 0.5")):
        cm = CountingModel(cfgmod.load_config(d), wmod.Weights(d), cfgmod.Revision("current"))
        CountingModel.fires = 0
        lc, _ = mdl.run(cm, toks, 37)
        fires = CountingModel.fires
        l_noclamp, _ = mdl.run(load(d, "current", shared_clamp=False), toks, 37)
        l_ini, _ = mdl.run(load(d, "initial"), toks, 37)
        l_ini_kv, _ = mdl.run(load(d, "initial", kv_fp8_sim=True), toks, 37)
        same = torch.equal(lc, l_noclamp)
        print(f"    {label}: shared-expert values beyond the limit: {fires}; "
              f"current vs current-without-shared-clamp: {fmt(compare(l_noclamp, lc))}")
        check(same == (fires == 0), f"{label}: the shared clamp changes logits iff it fires")
        check(bool(torch.equal(l_ini_kv, l_noclamp)),
              f"{label}: initial + KV FP8 sim == current - shared clamp (no third difference)")
        c = compare(l_ini, lc)
        print(f"    {label}: initial vs current: {fmt(c)}")
        check(c[1] > 0, f"{label}: the revisions differ")


def test_cli(d, tmp, toks):
    print("command line")
    tok = ",".join(map(str, toks[:20]))
    out, mout, dump = (os.path.join(tmp, n) for n in ("l.bin", "m.bin", "d.safetensors"))
    py = sys.executable
    subprocess.run([py, os.path.join(HERE, "dsv4_ref.py"), "logits", "--model", d, "--tokens", tok,
                    "--prefill", "7", "--mtp-out", mout, "--out", out], check=True)
    m = load(d)
    a, ma = mdl.run(m, toks[:20], 7, mtp=True)
    V = m.cfg.vocab_size
    la = torch.from_numpy(np.fromfile(out, "<f4").reshape(-1, V).astype(np.float64))
    lm = torch.from_numpy(np.fromfile(mout, "<f4").reshape(-1, V).astype(np.float64))
    check(la.shape == (20, V) and lm.shape == (19, V) and torch.equal(la, a) and torch.equal(lm, ma),
          "logits/--mtp-out files: float32 [T, vocab] and [T-1, vocab], equal to the in-process run")
    tf = os.path.join(tmp, "toks.txt")
    with open(tf, "w") as f:
        f.write(" ".join(map(str, toks[:10])) + "\n" + "\n".join(map(str, toks[10:20])))
    subprocess.run([py, os.path.join(HERE, "dsv4_ref.py"), "dump", "--model", d, "--tokens-file", tf,
                    "--prefill", "7", "--out", dump], check=True)
    t, meta = st.read_file(dump)
    ok = (meta["tokens"] == tok and meta["prefill"] == "7" and meta["revision"] == "current"
          and np.array_equal(t["logits"].array, la.numpy().astype(np.float32))
          and t["L1.idx_topk"].dtype == "I32" and t["L0.x_out"].shape == (20, m.cfg.hc_mult, m.cfg.dim))
    check(ok, "dump: tokens file parsed, metadata, stage shapes, logits equal to `logits`")


def test_noise(d, name, T, N):
    print(f"noise floor of f32 engines, {name} (T = {T}, prefill {N})")
    m = load(d)
    toks = tokens(m.cfg, T, 7)
    ref, mref = mdl.run(m, toks, T, mtp=True)
    mdl.ACC = torch.float32
    try:
        a, ma = mdl.run(m, toks, N, mtp=True)
    finally:
        mdl.ACC = torch.float64
    print(f"    f32 accumulation:  logits {fmt(compare(a, ref))}\n"
          f"                       MTP    {fmt(compare(ma, mref))}")
    nx.PERTURB = torch.Generator().manual_seed(1)
    try:
        a, ma = mdl.run(m, toks, N, mtp=True)
    finally:
        nx.PERTURB = None
    print(f"    < 1 ulp f32 noise: logits {fmt(compare(a, ref))}\n"
          f"                       MTP    {fmt(compare(ma, mref))}")


def main():
    torch.set_num_threads(2)
    p = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(HERE))
    default = next((c for c in (os.path.join(root, "build-ref", "dsv4"), os.path.join(root, "dsv4"))
                    if os.path.exists(c)), None)
    p.add_argument("--dsv4", default=default, help="dsv4 binary (for `dsv4 gen`)")
    p.add_argument("--noise", action="store_true", help="also measure the f32-accumulation noise floor")
    p.add_argument("--v41-only", action="store_true", help="only the number formats and the V4.1 checks")
    args = p.parse_args()
    if not args.dsv4 and not args.v41_only:
        sys.exit("no dsv4 binary found: build one (make) or pass --dsv4 (or --v41-only)")
    tmp = tempfile.mkdtemp(prefix="dsv4-ref-test-")
    try:
        test_numerics()
        test_safetensors(tmp)
        test_ref_v41.run_all(check, tmp)
        if args.v41_only:
            return finish()
        da = gen(args.dsv4, tmp, "tiny-a", ["--preset", "tiny-a", "--seed", "1"])
        db = gen(args.dsv4, tmp, "tiny-b", ["--preset", "tiny-b", "--seed", "2"])
        dl = gen(args.dsv4, tmp, "tiny-a-limit", ["--preset", "tiny-a", "--seed", "3", "--swiglu-limit", "0.5"])
        _, toks = test_consistency(da, "tiny-a", 101, [1, 3, 5, 37])
        test_consistency(db, "tiny-b", 364, [1, 5, 300])
        test_revisions(da, dl, toks)
        test_cli(da, tmp, toks)
        if args.noise:
            test_noise(da, "tiny-a", 101, 37)
            test_noise(db, "tiny-b", 364, 300)
            test_noise(dl, "tiny-a --swiglu-limit 0.5", 101, 37)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


def finish():
    print(f"\n{len(FAILS)} failure(s)" if FAILS else "\nall checks passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
