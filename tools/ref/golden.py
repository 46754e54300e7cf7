#!/usr/bin/python3
"""golden.py - regenerates the golden fixtures of tests/golden/ (`make golden`).

Owns: the list of fixture checkpoints and cases, and writing them. For every checkpoint it
runs `dsv4 gen` into a temporary directory, runs the reference (model.py) on seeded token
sequences, checks that every prefill split listed for a case gives the same logits as the
stored ones (the reference is chunk-consistent: they must agree to 1e-6), measures the noise
floor an engine doing f32 arithmetic will show on that case (two models, see
measure_noise), and writes one safetensors file per
checkpoint; plus one per-stage dump (same format as `dsv4_ref.py dump`) of a short prompt.

Why here: fixtures must be reproducible from the repository alone (the exact gen command is
in each file's metadata) and small (F16 logits, ~9 MB in all). tests/golden/README.md
documents the format and the tolerances.

Usage: /usr/bin/python3 tools/ref/golden.py --dsv4 PATH/TO/dsv4 [--out tests/golden]
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
import model_v41 as mv41  # noqa: E402
import numerics as nx  # noqa: E402
import st  # noqa: E402
import weights as wmod  # noqa: E402

FORMAT = "dsv4-golden/1"

# name, `dsv4 gen` arguments, token-sequence seed, cases.
# A case: key, length T, revision, prefill splits the C test runs (the stored logits come
# from the first one; the others are verified equal), whether MTP logits are stored (V4.1:
# its DSpark rows, `{key}.dspark` [(T-1) x B, vocab + 1], the confidence last), and
# optionally "prefix": reuse the first T tokens of another case's sequence.
FIXTURES = [
    ("tiny-a", ["--preset", "tiny-a", "--seed", "1"], 101, [
        dict(key="seq", T=101, revision="current", splits=[37, 1, 3, 5, 101], mtp=True),
        dict(key="seq_initial", T=101, revision="initial", splits=[37, 1], mtp=False),
    ]),
    ("tiny-b", ["--preset", "tiny-b", "--seed", "2"], 102, [
        dict(key="seq", T=364, revision="current", splits=[300, 1, 3, 5, 37, 364], mtp=True),
        dict(key="seq_initial", T=164, revision="initial", splits=[100, 1], mtp=False),
    ]),
    ("tiny-a-limit", ["--preset", "tiny-a", "--seed", "3", "--swiglu-limit", "0.5"], 103, [
        dict(key="seq", T=101, revision="current", splits=[37, 1, 5], mtp=True),
        dict(key="seq_initial", T=101, revision="initial", splits=[37, 1], mtp=False),
    ]),
    ("tiny-a-fp8", ["--preset", "tiny-a", "--seed", "4", "--fp8-experts", "--f32-scales", "--single-file"], 104, [
        dict(key="seq", T=101, revision="current", splits=[37, 1, 3], mtp=True),
    ]),
    # DeepSeek-V4.1 (model_v41.py): 40 tokens wrap the window of 16 twice, give the ratio-2 kv
    # source 20 compressed rows and the ratio-1 one 40 (index_topk 4), and let the candidate
    # pre-filter (3 blocks of 2 keys) exclude blocks from position 6 on. DSpark rows after
    # every position but the last (each with the true next token, a greedy Markov chain).
    ("tiny-v41", ["--preset", "tiny-v41", "--seed", "1"], 105, [
        dict(key="seq", T=40, revision="current", splits=[40, 1, 3, 7], mtp=True),
    ]),
]

# Per-stage dump: checkpoint, token seed, length, prefill.
DUMP = ("tiny-a", 101, 24, 20)


def token_sequence(vocab, T, seed):
    """BOS (0) then T-1 ids drawn uniformly from [2, vocab) with numpy's PCG64."""
    rng = np.random.default_rng(seed)
    return [0] + rng.integers(2, vocab, T - 1).tolist()


def load_model(d, revision):
    """model.Model for V4 checkpoints, model_v41.ModelV41 for V4.1 (by config.json)."""
    cfg = cfgmod.load_config(d)
    if cfg.arch == "v4.1":
        return mv41.ModelV41(cfg, wmod.Weights(d, cfg.weight_block))
    return mdl.Model(cfg, wmod.Weights(d), cfgmod.Revision(revision))


def run(m, toks, N, mtp):
    """(logits, MTP logits or None) of either release's model; V4.1: (logits, its DSpark rows
    [(T-1) x B, vocab + 1] with the confidence last, or None)."""
    if isinstance(m, mv41.ModelV41):
        lg, spark = mv41.run(m, toks, N, dspark=mtp)
        if spark is None:
            return lg, None
        rows = torch.cat([spark[0], spark[1][..., None]], -1)
        return lg, rows.reshape(-1, rows.shape[-1])
    return mdl.run(m, toks, N, mtp=mtp)


def rel_l2(a, b):
    rel = (a - b).norm(dim=1) / b.norm(dim=1)
    return float(rel.median()), float((a - b).norm() / b.norm()), float((a.argmax(1) == b.argmax(1)).double().mean())


def fmt_noise(c):
    return f"median {c[0]:.4f} overall {c[1]:.4f} argmax {c[2]:.4f}"


def measure_noise(m, toks, N, want_mtp, ref, mref):
    """Noise floor of the case for two models of an engine: (1) dot products accumulated in
    float32 instead of exactly; (2) every rounding point's input off by < 1 f32 ulp (random,
    two seeds, the worse kept), a model of an engine doing its f32 arithmetic in another order."""
    out = {}
    mdl.ACC = torch.float32
    try:
        a, ma = run(m, toks, N, want_mtp)
    finally:
        mdl.ACC = torch.float64
    out["noise_f32acc"] = fmt_noise(rel_l2(a, ref))
    if want_mtp:
        out["mtp_noise_f32acc"] = fmt_noise(rel_l2(ma, mref))
    worst, mworst = None, None
    for seed in (1, 2):
        nx.PERTURB = torch.Generator().manual_seed(seed)
        try:
            a, ma = run(m, toks, N, want_mtp)
        finally:
            nx.PERTURB = None
        c = rel_l2(a, ref)
        worst = c if worst is None or c[1] > worst[1] else worst
        if want_mtp:
            c = rel_l2(ma, mref)
            mworst = c if mworst is None or c[1] > mworst[1] else mworst
    out["noise_ulp"] = fmt_noise(worst)
    if want_mtp:
        out["mtp_noise_ulp"] = fmt_noise(mworst)
    return out


def f16(t):
    return t.to(torch.float32).numpy().astype(np.float16)


def build_case(d, case, toks, meta):
    m = load_model(d, case["revision"])
    v41 = isinstance(m, mv41.ModelV41)
    want_mtp = case["mtp"] and (m.has_dspark if v41 else m.has_mtp)
    k = case["key"]
    ref, mref = run(m, toks, case["splits"][0], want_mtp)
    worst = 0.0
    for N in case["splits"][1:]:
        a, ma = run(m, toks, N, want_mtp)
        worst = max(worst, rel_l2(a, ref)[1], rel_l2(ma, mref)[1] if want_mtp else 0.0)
    if worst > 1e-6:
        raise SystemExit(f"{d} {k}: prefill splits disagree (overall rel L2 {worst:.3g}); the reference "
                         "is no longer chunk-consistent")
    noise = measure_noise(m, toks, case["splits"][0], want_mtp, ref, mref)
    out = {f"{k}.tokens": np.array(toks, dtype=np.int32),
           f"{k}.prefill": np.array(case["splits"], dtype=np.int32),
           f"{k}.logits": f16(ref)}
    if want_mtp:
        out[f"{k}.dspark" if v41 else f"{k}.mtp_logits"] = f16(mref)
    meta[f"{k}.revision"] = case["revision"]
    meta[f"{k}.ref_prefill"] = str(case["splits"][0])
    meta[f"{k}.split_max_rel_l2"] = f"{worst:.3g}"
    meta.update({f"{k}.{n}": v for n, v in noise.items()})
    print(f"  {k}: T={len(toks)} {case['revision']} splits {case['splits']} (max split diff {worst:.3g})", flush=True)
    for n, v in noise.items():
        print(f"      {n}: {v}", flush=True)
    return out


def main():
    torch.set_num_threads(2)
    p = argparse.ArgumentParser()
    p.add_argument("--dsv4", required=True, help="the dsv4 binary (for `dsv4 gen`)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "golden"))
    p.add_argument("--only", help="regenerate only this fixture (name)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="dsv4-golden-")
    try:
        dirs = {}
        for name, gen_args, seed, cases in FIXTURES:
            if args.only and name != args.only and not (name == DUMP[0] and args.only == "dump"):
                continue
            d = os.path.join(tmp, name)
            subprocess.run([args.dsv4, "gen", "-q", "-o", d] + gen_args, check=True)
            dirs[name] = d
            if args.only == "dump":
                continue
            print(f"{name}: dsv4 gen {' '.join(gen_args)}", flush=True)
            cfg = cfgmod.load_config(d)
            full = token_sequence(cfg.vocab_size, max(c["T"] for c in cases), seed)
            meta = {"format": FORMAT, "checkpoint": name, "gen_args": "dsv4 gen " + " ".join(gen_args),
                    "preset": gen_args[gen_args.index("--preset") + 1],
                    "seed": gen_args[gen_args.index("--seed") + 1], "token_seed": str(seed),
                    "cases": ",".join(c["key"] for c in cases), "vocab_size": str(cfg.vocab_size),
                    "generator": "tools/ref/golden.py", "torch": torch.__version__,
                    "readme": "tests/golden/README.md"}
            tensors = {}
            for case in cases:
                tensors.update(build_case(d, case, full[:case["T"]], meta))
            path = os.path.join(args.out, f"{name}.safetensors")
            st.write_file(path, tensors, meta)
            print(f"  wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)", flush=True)
        if not args.only or args.only in ("dump", DUMP[0]):
            name, seed, T, N = DUMP
            d = dirs[name]
            gen_args = next(f[1] for f in FIXTURES if f[0] == name)
            cfg = cfgmod.load_config(d)
            toks = token_sequence(cfg.vocab_size, T, seed)
            m = mdl.Model(cfg, wmod.Weights(d), cfgmod.Revision("current"))
            rec = mdl.Recorder()
            mdl.run(m, toks, N, mtp=m.has_mtp, rec=rec)
            meta = {"format": "dsv4-ref-dump/1", "tokens": ",".join(map(str, toks)), "prefill": str(N),
                    "revision": "current", "checkpoint": name, "gen_args": "dsv4 gen " + " ".join(gen_args),
                    "n_layers": str(cfg.n_layers), "mtp": str(int(m.has_mtp)),
                    "generator": "tools/ref/golden.py", "torch": torch.__version__}
            stages = {k: (v.to(torch.int32).numpy() if v.dtype in (torch.int32, torch.int64)
                          else v.to(torch.float32).numpy()) for k, v in rec.result().items()}
            path = os.path.join(args.out, f"{name}.dump.safetensors")
            st.write_file(path, stages, meta)
            print(f"dump: {name} T={T} prefill {N}: wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
