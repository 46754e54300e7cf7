#!/usr/bin/python3
"""dsv4_ref.py - command line of dsv4's executable reference of the DeepSeek-V4 forward.

Owns: the two commands the C engine mirrors and compares against (tools/ref/README.md):

  logits --model DIR (--tokens 0,5,9 | --tokens-file F) [--prefill N]
         [--revision current|initial] [--mtp-out FILE] --out FILE
      float32 little-endian [T, vocab] logits, no header; row t = logits after tokens[0..t].
      The first N tokens (default all) go in one forward call, the rest one per call.
      --mtp-out: float32 [T-1, vocab]; row t = MTP head on the main model's last-layer
      streams at t plus the embedding of tokens[t+1] (predicts tokens[t+2]), position t.

      DeepSeek-V4.1 checkpoints (config.json with a text_config) run model_v41.py;
      --dspark-out FILE (V4.1 only): float32 [T-1, B, vocab + 1]; row t = the DSpark draft
      block after position t with tokens[t+1] as its first token: per draft i (position
      t+1+i) its logits (Markov bias included) and then its confidence.

  dump --model DIR (--tokens ... | --tokens-file F) [--prefill N] [--revision ...] --out F.safetensors
      every named intermediate (per layer, all positions stacked), F32 / I32, with tokens,
      prefill and revision in __metadata__.

Why here: the model lives in model.py; this file only parses arguments and writes files.
Run with Debian's /usr/bin/python3 (torch 1.13, numpy); nothing else is needed.
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import config as cfgmod  # noqa: E402
import model as mdl  # noqa: E402
import model_v41 as mv41  # noqa: E402
import st  # noqa: E402
import weights as wmod  # noqa: E402


def parse_tokens(args):
    if (args.tokens is None) == (args.tokens_file is None):
        sys.exit("give exactly one of --tokens and --tokens-file")
    text = args.tokens if args.tokens is not None else open(args.tokens_file).read()
    toks = [int(t) for t in re.split(r"[,\s]+", text.strip()) if t]
    if not toks:
        sys.exit("no tokens given")
    return toks


def load(model_dir, revision):
    """model.Model for V4 checkpoints, model_v41.ModelV41 for V4.1 (by config.json)."""
    cfg = cfgmod.load_config(model_dir)
    if cfg.arch == "v4.1":
        if revision != "current":
            sys.exit("--revision: DeepSeek-V4.1 has one revision (current)")
        return mv41.ModelV41(cfg, wmod.Weights(model_dir, cfg.weight_block))
    return mdl.Model(cfg, wmod.Weights(model_dir), cfgmod.Revision(revision))


def is_v41(m):
    return m.cfg.arch == "v4.1"


def run_any(m, toks, prefill, extra, rec=mdl.NO_RECORD):
    """(logits, MTP logits or DSpark (logits, confidence) or None) for either model."""
    if is_v41(m):
        return mv41.run(m, toks, prefill, dspark=extra, rec=rec)
    return mdl.run(m, toks, prefill, mtp=extra, rec=rec)


def write_f32(t, path):
    t.to(torch.float32).numpy().astype("<f4").tofile(path)


def check_tokens(m, toks):
    bad = [t for t in toks if not 0 <= t < m.cfg.vocab_size]
    if bad:
        sys.exit(f"token id {bad[0]} outside [0, {m.cfg.vocab_size})")


def cmd_logits(args):
    toks = parse_tokens(args)
    m = load(args.model, args.revision)
    check_tokens(m, toks)
    want_mtp, want_spark = args.mtp_out is not None, args.dspark_out is not None
    if want_mtp and not m.has_mtp:
        sys.exit("--mtp-out: the checkpoint has no MTP block" + (" (V4.1: --dspark-out)" if is_v41(m) else ""))
    if want_spark and not (is_v41(m) and m.has_dspark):
        sys.exit("--dspark-out: the checkpoint has no DSpark stages")
    logits, extra = run_any(m, toks, args.prefill, want_mtp or want_spark)
    write_f32(logits, args.out)
    if want_mtp:
        write_f32(extra, args.mtp_out)
    if want_spark:
        write_f32(torch.cat([extra[0], extra[1][..., None]], -1), args.dspark_out)


def dump_metadata(m, args, toks):
    N = len(toks) if args.prefill is None else max(1, min(args.prefill, len(toks)))
    return {"format": "dsv4-ref-dump/1", "tokens": ",".join(map(str, toks)), "prefill": str(N),
            "revision": m.rev.name, "model": os.path.abspath(args.model),
            "n_layers": str(m.cfg.n_layers), "mtp": str(int(m.has_mtp)), "arch": m.cfg.arch}


def to_numpy(t):
    if t.dtype in (torch.int32, torch.int64):
        return t.to(torch.int32).numpy()
    return t.to(torch.float32).numpy()


def cmd_dump(args):
    toks = parse_tokens(args)
    m = load(args.model, args.revision)
    check_tokens(m, toks)
    rec = mdl.Recorder()
    run_any(m, toks, args.prefill, m.has_mtp and len(toks) > 1, rec=rec)
    stages = rec.result()
    st.write_file(args.out, {k: to_numpy(v) for k, v in stages.items()}, dump_metadata(m, args, toks))


def main(argv=None):
    torch.set_num_threads(2)
    p = argparse.ArgumentParser(prog="dsv4_ref.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("logits", "dump"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
        s.add_argument("--tokens", help="comma/space separated token ids")
        s.add_argument("--tokens-file", help="file of token ids separated by commas, spaces or newlines")
        s.add_argument("--prefill", type=int, default=None, help="tokens in the first call (default: all)")
        s.add_argument("--revision", choices=("current", "initial"), default="current")
        s.add_argument("--out", required=True)
        if name == "logits":
            s.add_argument("--mtp-out", help="also write MTP logits [T-1, vocab] here")
            s.add_argument("--dspark-out", help="V4.1: also write DSpark rows [T-1, B, vocab + 1] here")
    args = p.parse_args(argv)
    if args.prefill is not None and args.prefill < 1:
        sys.exit("--prefill must be at least 1")
    (cmd_logits if args.cmd == "logits" else cmd_dump)(args)


if __name__ == "__main__":
    main()
