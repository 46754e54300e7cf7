#!/usr/bin/python3
"""make_fixture.py - the reference's answers on the demo model, for tests/unit/test_demo_model.c.

Owns: tests/demo/ (regenerate after retraining the demo model):
  * kjv-v4-tiny.ref.safetensors
      logits.tokens  I32 [T]      BOS + the first T-1 ids of the held-out text
      logits.logits  F16 [T, V]   the reference's logits, whole sequence in one call
      greedy.prompt  I32 [n]      BOS + the encoding of GREEDY_PROMPT
      greedy.tokens  I32 [m]      the reference's greedy continuation (argmax, ties to the
                                  lower id, as dsv4's sampler), one token per call
      greedy.margins F32 [m]      top-1 minus top-2 logit at each of those steps (an engine
                                  that sums in another order may flip the small ones)
    metadata:
    ppl.ctx, ppl.n_tokens, ppl.nll, ppl.perplexity (the reference on heldout-excerpt.txt with
    the `dsv4 perplexity` protocol), model, generator.
  * heldout-excerpt.txt: the first EXCERPT_LINES lines of the held-out text (Revelation...).

All reference numbers come from tools/ref (float64 between the demo's rounding points, current
revision), the project's executable definition of the V4 forward.

    make_fixture.py --model models/kjv-v4-tiny --heldout build-train/heldout.txt --out tests/demo
"""

import argparse
import math
import os
import sys

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(1, os.path.join(here, "..", "ref"))

import bpe  # noqa: E402
import config as cfgmod  # noqa: E402
import model as mdl  # noqa: E402
import weights as wmod  # noqa: E402
from export import write_safetensors  # noqa: E402

LOGITS_T = 80
GREEDY_PROMPT = "For God so loved the world"   # its greedy path starts with 25 clear choices
GREEDY_N = 40
EXCERPT_LINES = 10
PPL_CTX = 256


def argmax_low(row):
    """Index of the largest value, the lowest index on ties (dsv4's greedy sampler)."""
    m = row.max()
    return int(torch.nonzero(row == m)[0])


def main():
    p = argparse.ArgumentParser(prog="make_fixture.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--heldout", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    tok = bpe.Tokenizer(os.path.join(args.model, "tokenizer.json"))
    cfg = cfgmod.load_config(args.model)
    m = mdl.Model(cfg, wmod.Weights(args.model), cfgmod.Revision("current"))

    with open(args.heldout, encoding="utf-8") as f:
        held = f.read()
    excerpt = "".join(held.splitlines(keepends=True)[:EXCERPT_LINES])
    with open(os.path.join(args.out, "heldout-excerpt.txt"), "w", encoding="utf-8") as f:
        f.write(excerpt)

    # logits of a fixed sequence
    ids = [tok.bos] + tok.encode(held)[:LOGITS_T - 1]
    logits, _ = mdl.run(m, ids)
    print(f"logits: {len(ids)} tokens")

    # greedy continuation, one token per call (as `dsv4 run` decodes)
    prompt = [tok.bos] + tok.encode(GREEDY_PROMPT)
    state = mdl.State(cfg)
    row = m.forward(state, prompt)[-1]
    gen, margins = [], []
    for _ in range(GREEDY_N):
        t = argmax_low(row)
        top2 = torch.topk(row, 2).values
        margins.append(float(top2[0] - top2[1]))
        gen.append(t)
        row = m.forward(state, [t])[-1]
    print(f"greedy: {tok.decode(prompt[1:])!r} -> {tok.decode(gen)!r}")
    print(f"  margins: {' '.join(f'{x:.2f}' for x in margins)}")

    # perplexity of the excerpt, the `dsv4 perplexity` protocol
    ex_ids = tok.encode(excerpt)
    per, nll, n = PPL_CTX - 1, 0.0, 0
    for s in range(0, len(ex_ids), per):
        w = [tok.bos] + ex_ids[s:s + per]
        lg, _ = mdl.run(m, w)
        lp = torch.log_softmax(lg[:len(w) - 1], -1)
        nll -= float(lp.gather(1, torch.tensor(w[1:])[:, None]).sum())
        n += len(w) - 1
    print(f"perplexity: {math.exp(nll / n):.4f} over {n} tokens")

    f16 = logits.to(torch.float32).numpy().astype(np.float16).view(np.uint16)
    tensors = [("logits.tokens", "I32", np.asarray(ids, dtype="<i4")),
               ("logits.logits", "F16", f16),
               ("greedy.prompt", "I32", np.asarray(prompt, dtype="<i4")),
               ("greedy.tokens", "I32", np.asarray(gen, dtype="<i4")),
               ("greedy.margins", "F32", np.asarray(margins, dtype="<f4"))]
    meta = {"format": "dsv4-demo-fixture/1", "model": os.path.basename(os.path.normpath(args.model)),
            "generator": "tools/train/make_fixture.py (tools/ref, revision current)",
            "greedy.text": GREEDY_PROMPT,
            "ppl.ctx": str(PPL_CTX), "ppl.n_tokens": str(n), "ppl.nll": f"{nll / n:.9f}",
            "ppl.perplexity": f"{math.exp(nll / n):.6f}"}
    path = os.path.join(args.out, "kjv-v4-tiny.ref.safetensors")
    write_safetensors(path, tensors, meta)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
