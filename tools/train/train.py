#!/usr/bin/python3
"""train.py - trains the demo model (v4.py) on the KJV training text.

Owns: the training run: data windows, optimiser and schedule, the phases of the indexer
and of quantisation-aware training, auxiliary-loss-free load balancing of the score-routed
layers, periodic held-out evaluation, and checkpoints from which a run resumes exactly.

A run is a pure function of (config, tokenizer, text, seed, options): one thread, seeded
generators, and a checkpoint that stores every piece of state (weights, router biases,
optimiser moments, step, generator states), so a resumed run continues bit for bit.

Schedule (fractions of --steps):
  * learning rate: linear warm-up over 100 steps, cosine decay to 10% at the end;
  * 0 - dense_until: CSA layers attend to every completed compressed row while the
    indexer learns by distillation (v4.py); afterwards they attend to its top-k only;
  * qat_from - 1: quantisation-aware training (the exported formats are simulated);
  * MTP loss weight 0.3, then 0.1 from 70% on (DeepSeek-V3's recipe);
  * score-routed layers: after each step every expert's selection bias moves by
    `bias_rate` toward balance (sign of mean load minus its load).

Samples: BOS, then the seq - 1 tokens that follow a random verse start; a fraction
(--chat-frac) are conversations in V4's chat format instead, so that `dsv4 chat` gets
answers that end: the user says a verse, the assistant answers with the verse that follows
and EOS, turn after turn (BOS <｜User｜>v1<｜Assistant｜></think>v2 EOS <｜User｜>v3 ...), exactly
the string the official encoder renders for such messages in chat mode.

    train.py --data build-train --out build-train/run --steps 3000
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bpe  # noqa: E402
import v4  # noqa: E402


def log(msg, f=None):
    line = time.strftime("%H:%M:%S ") + msg
    print(line, flush=True)
    if f:
        f.write(line + "\n")
        f.flush()


def encode_file(tok, path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    ids = np.array(tok.encode(text), dtype=np.int64)
    nl = [i for s, i in tok.vocab.items() if s.endswith("Ċ")]      # tokens that end a line
    is_nl = np.isin(ids, nl)
    starts = np.nonzero(np.concatenate(([True], is_nl[:-1])))[0]      # first token of each line
    return ids, starts


def verse_tokens(tok, path):
    """Token ids of every verse (one line of the text, without its newline), in order."""
    with open(path, encoding="utf-8") as f:
        return [tok.encode(line) for line in f.read().split("\n") if line.strip()]


def chat_sample(verses, i, seq, tok):
    """seq ids of a conversation starting at verse i (user) answered by verse i+1, and so on."""
    user, asst, think_end = (tok.added[t] for t in ("<｜User｜>", "<｜Assistant｜>", "</think>"))
    ids = [tok.bos]
    while len(ids) < seq:
        ids += [user] + verses[i % len(verses)] + [asst, think_end] + verses[(i + 1) % len(verses)] + [tok.eos]
        i += 2
    return np.array(ids[:seq], dtype=np.int64)


def param_groups(model, wd):
    decay, keep = [], []
    for name, p in model.named_parameters():
        (decay if name.endswith(".weight") and p.dim() == 2 else keep).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": keep, "weight_decay": 0.0}]


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def eval_windows(ids, ctx, bos, n_max=None):
    """The perplexity protocol of `dsv4 perplexity`: windows [BOS] + ctx-1 tokens."""
    n = ctx - 1
    out = []
    for s in range(0, len(ids), n):
        chunk = ids[s:s + n]
        out.append(np.concatenate(([bos], chunk)))
        if n_max and len(out) >= n_max:
            break
    return out


@torch.no_grad()
def evaluate(model, windows, dense_csa=False):
    """Mean NLL (nats) per scored token over windows, in float32 (QAT state as it is)."""
    model.eval()
    tot, cnt = 0.0, 0
    for w in windows:
        x = torch.from_numpy(w).unsqueeze(0)
        logits, _, _ = model(x, dense_csa=dense_csa, mtp=False)
        tot += F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum").item()
        cnt += len(w) - 1
    model.train()
    return tot / cnt


def save(path, model, opt, step, gen, np_rng, args, cfg_json, history):
    tmp = path + ".tmp"
    torch.save({"config": cfg_json, "model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "gen": gen.get_state(), "np_rng": np_rng.get_state(), "args": vars(args),
                "history": history}, tmp)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--config", default=os.path.join(here, "kjv-v4-tiny.json"))
    p.add_argument("--data", required=True, help="directory with train.txt, heldout.txt, tokenizer.json")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--dense-until", type=float, default=0.25)
    p.add_argument("--qat-from", type=float, default=0.85)
    p.add_argument("--bias-rate", type=float, default=1e-3)
    p.add_argument("--chat-frac", type=float, default=0.1, help="share of samples in the chat format")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a shared 2-core machine a second thread mostly waits)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "train.log"), "a")
    with open(args.config) as f:
        cfg_json = json.load(f)
    cfg = v4.Cfg(cfg_json)

    tok = bpe.Tokenizer(os.path.join(args.data, "tokenizer.json"))
    if tok.n_vocab() > cfg.vocab:
        sys.exit(f"tokenizer has {tok.n_vocab()} ids, config vocab_size {cfg.vocab}")
    train_ids, starts = encode_file(tok, os.path.join(args.data, "train.txt"))
    held_ids, _ = encode_file(tok, os.path.join(args.data, "heldout.txt"))
    verses = verse_tokens(tok, os.path.join(args.data, "train.txt"))
    starts = starts[starts + args.seq - 1 <= len(train_ids)]
    held = eval_windows(held_ids, args.seq, tok.bos, n_max=16)
    log(f"train {len(train_ids)} tokens ({len(starts)} verse starts), held-out {len(held_ids)} tokens", logf)

    torch.manual_seed(args.seed)
    model = v4.Model(cfg)
    model.init_hash(torch.Generator().manual_seed(args.seed + 1))
    opt = torch.optim.AdamW(param_groups(model, args.wd), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed + 2)
    np_rng = np.random.RandomState(args.seed + 3)
    step, history = 0, []
    ck_path = os.path.join(args.out, "ckpt.pt")
    if os.path.exists(ck_path):
        ck = torch.load(ck_path, map_location="cpu")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        np_rng.set_state(ck["np_rng"])
        step, history = ck["step"], ck["history"]
        log(f"resumed at step {step}", logf)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters; {args.steps} steps of {args.batch}x{args.seq} tokens", logf)

    t_start, tok_seen = time.time(), 0
    model.train()
    while step < args.steps:
        frac = step / args.steps
        dense = frac < args.dense_until
        v4.QAT.on = frac >= args.qat_from
        mtp_w = 0.3 if frac < 0.7 else 0.1
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        s = starts[np_rng.randint(0, len(starts), size=args.batch)]
        chat = np_rng.random_sample(args.batch) < args.chat_frac
        vs = np_rng.randint(0, len(verses), size=args.batch)
        x = np.stack([chat_sample(verses, v, args.seq, tok) if c else
                      np.concatenate(([tok.bos], train_ids[i:i + args.seq - 1])) for i, c, v in zip(s, chat, vs)])
        x = torch.from_numpy(x)
        logits, mlog, idx_losses = model(x, dense_csa=dense)
        loss_main = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        loss_mtp = F.cross_entropy(mlog[:, :-1].flatten(0, 1), x[:, 2:].flatten())
        loss_idx = sum(idx_losses) / max(1, len(idx_losses))
        loss = loss_main + mtp_w * loss_mtp + loss_idx
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        with torch.no_grad():
            for moe in model.routed_layers():
                load = moe.load.float()
                moe.gate.bias += args.bias_rate * torch.sign(load.mean() - load)
        step += 1
        tok_seen += x.numel()
        if step % 10 == 0 or step == 1:
            el = time.time() - t_start
            imb = max(float(m.load.max() / m.load.float().mean()) for m in model.routed_layers())
            log(f"step {step:5d} loss {loss_main.item():.4f} mtp {loss_mtp.item():.4f} idx {float(loss_idx):.4f} "
                f"gnorm {float(gnorm):.2f} lr {lr_at(step - 1, args):.2e} maxload {imb:.2f} "
                f"{'dense ' if dense else ''}{'qat ' if v4.QAT.on else ''}{tok_seen / el:.0f} tok/s", logf)
        if step % args.eval_every == 0 or step == args.steps:
            nll = evaluate(model, held, dense_csa=dense)
            history.append((step, nll))
            log(f"eval step {step}: held-out nll {nll:.4f} ppl {math.exp(nll):.2f}", logf)
        if step % args.ckpt_every == 0 or step == args.steps:
            save(ck_path, model, opt, step, gen, np_rng, args, cfg_json, history)
    torch.save({"config": cfg_json, "model": model.state_dict(), "step": step, "args": vars(args),
                "history": history}, os.path.join(args.out, "final.pt"))
    log(f"done: {step} steps, {(time.time() - t_start) / 60:.1f} min this session", logf)


if __name__ == "__main__":
    main()
