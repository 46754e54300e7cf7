#!/usr/bin/python3
"""eval_ppl.py - perplexity with the protocol of `dsv4 perplexity`, computed in Python.

Owns: the two Python sides of the demo model's quality figures:
  --float CKPT   the float32 training model (train.py checkpoint; --qat to simulate the
                 exported formats instead);
  --ref DIR      the project's PyTorch reference (tools/ref) on an exported checkpoint.
The protocol is cmd_perplexity.c's: the text is tokenized whole (bpe.py, the same ids as
dsv4's C tokenizer), cut into pieces of ctx - 1 ids, each evaluated from an empty state as
BOS + piece, every text token scored once. --save-logits writes the same DSV4LGT1 file as
`dsv4 perplexity --save-logits`, so `dsv4 perplexity --kl-base` measures the engine's KL
divergence from either of these.

    eval_ppl.py --ref models/kjv-v4-tiny -f build-train/heldout.txt --ctx 512
"""

import argparse
import math
import os
import struct
import sys
import time

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(1, os.path.join(here, "..", "ref"))

import bpe  # noqa: E402


def windows(ids, ctx, bos):
    per = ctx - 1
    return [[bos] + ids[s:s + per] for s in range(0, len(ids), per)]


def float_scorer(ckpt, qat):
    import export
    import v4
    model, _ = export.load_model(ckpt)
    model.eval()
    v4.QAT.on = qat

    def logits(w):
        with torch.no_grad():
            lg, _, _ = model(torch.tensor([w]), mtp=False)
        return lg[0].double()
    return logits, model.cfg.vocab


def ref_scorer(model_dir):
    import config as cfgmod
    import model as mdl
    import weights as wmod
    cfg = cfgmod.load_config(model_dir)
    m = mdl.Model(cfg, wmod.Weights(model_dir), cfgmod.Revision("current"))

    def logits(w):
        lg, _ = mdl.run(m, w)
        return lg
    return logits, cfg.vocab_size


def main():
    p = argparse.ArgumentParser(prog="eval_ppl.py", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--float", dest="ckpt", help="train.py checkpoint (.pt)")
    g.add_argument("--ref", help="checkpoint directory, run through tools/ref")
    p.add_argument("--qat", action="store_true", help="with --float: simulate the exported formats")
    p.add_argument("-f", "--file", required=True)
    p.add_argument("--tokenizer", help="tokenizer.json (default: the --ref directory's)")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--save-logits")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok_path = args.tokenizer or (os.path.join(args.ref, "tokenizer.json") if args.ref else None)
    if not tok_path:
        sys.exit("--tokenizer is required with --float")
    tok = bpe.Tokenizer(tok_path)
    with open(args.file, encoding="utf-8") as f:
        ids = tok.encode(f.read())
    if args.max_tokens:
        ids = ids[:args.max_tokens]
    score, V = float_scorer(args.ckpt, args.qat) if args.ckpt else ref_scorer(args.ref)
    out = None
    if args.save_logits:
        out = open(args.save_logits, "wb")
        out.write(b"DSV4LGT1" + struct.pack("<IIIIQ", 1, V, args.ctx, 0, len(ids)))
        out.write(np.asarray(ids, dtype="<i4").tobytes())
    nll, n, t0 = 0.0, 0, time.time()
    ws = windows(ids, args.ctx, tok.bos)
    for k, w in enumerate(ws):
        lg = score(w)[:len(w) - 1]                                      # rows predicting w[1:]
        lp = torch.log_softmax(lg.double(), -1)
        tgt = torch.tensor(w[1:])
        nll -= lp.gather(1, tgt[:, None]).sum().item()
        n += len(w) - 1
        if out:
            out.write(lg.to(torch.float32).numpy().astype("<f4").tobytes())
        print(f"\r{k + 1}/{len(ws)} windows  ppl {math.exp(nll / n):.4f}  {n / (time.time() - t0):.0f} tok/s",
              end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    if out:
        out.close()
    print(f"perplexity: {math.exp(nll / n):.4f} over {n} tokens ({len(ws)} windows, ctx {args.ctx})")
    print(f"mean nll: {nll / n:.6f} nats/token")


if __name__ == "__main__":
    main()
