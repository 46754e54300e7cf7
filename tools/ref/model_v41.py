"""model_v41.py - the DeepSeek-V4.1 forward pass, as the official inference code computes it.

Owns: the V4.1 deltas of docs/MODEL.md §6 "What changes in the forward", for one sequence:
Engram (n-gram rows added into the hc streams; row indices from engram_ref.py), shared
compressed KV (only kv sources compress: ratio 2 = softmax gate over 2 tokens, no overlap, no
APE; ratio 1 = norm(wkv(x)); rows FP4 in groups of 16 with e4m3 scales), window KV FP8 per 32
over the whole row, the indexer on index sources only (keys k_norm(wk(latent)), FP4 per 32, no
Hadamard) with the candidate pre-filter (`select_candidate_blocks`), lagged hyper-connections
(`make_identity_pre_mix`, no hc_head), q norm on the low-rank part only, the router's
gate_temp, and the DSpark stages (`forward_spec`: `DSparkBlock`, `DSparkAttention` with its
own window ring from main_x and bidirectional attention inside the draft block,
`DSparkMarkovHead`, `DSparkConfidenceHead`). Everything V4 already had (RoPE/YaRN, Sinkhorn,
sparse attention with sinks, experts) is model.py's, reused through `Model`.

Numerics: model.py's style (float64 values on the official dtype grid, rounded with bf16()/f32()
at its dtype boundaries, sums exact), with V4.1's block sizes: FP8 weights per 32x32 block,
activations act-quantised per 32 (`fp8_block_size`).

Deliberate deviations from the official code (each keeps the result independent of how a
sequence is split into calls, or makes an unspecified choice deterministic):
  * the official decode bug (docs/MODEL.md §6 "The official decode bug"): a ratio-2 index
    source scores, on a decode step that completes no group, against whatever index keys were
    published last (another layer's). Here a layer always scores its own kv source's keys, the
    prefill semantics, on every path. `ModelV41.official_decode_keys = True` reproduces the
    official decode for tests (test_ref.py) and is never used otherwise;
  * chunk-consistent: any split of a sequence into calls gives the same values (the official
    code prefills from position 0 only and then decodes one token a call); one softmax max per
    query over its whole index set, as model.py;
  * ties: routing top-k, indexer top-k and candidate blocks prefer the lower index; the indexer
    keeps the best min(index_topk, #finite scores) rows (the official top-k could also pick a
    -inf, non-candidate row when fewer than index_topk candidate rows are reachable, which the
    released shapes cannot reach: (candidate_topk_blocks - 1) x block size >= index_topk);
  * an e4m3 scale of the compressed-KV FP4 above 448 saturates (the cast would give NaN);
  * text only: no image spans (Engram's token mask, the routers' image bias); the Engram
    token map is the checkpoint's engram_token_map.json, else computed from its tokenizer.json
    (`build_compressed_token_map`, engram_map_ref.py);
  * DSpark rows (`forward_spec`) are defined for every position t <= T-2 with the known next
    token tokens[t+1] as the block's first token (the official loop drafts after each decode
    step from the sampled token, none after the prefill), and the Markov chain inside a block
    takes each draft as the argmax of its logits (the official code samples with temperature).
"""

import json
import os

import numpy as np
import torch

import engram_map_ref
import engram_ref
import model as mdl
import numerics as nx
from config import Revision
from model import F64, NO_RECORD, Rows, mm, rmsnorm, topk_stable, with_rope
from numerics import bf16, f32

NEG_INF = float("-inf")


def f32c(v):
    """A Python constant as the f32 value the official code multiplies or compares with."""
    return torch.tensor(v, dtype=torch.float32).item()


def identity_pre_mix(n, hc):
    """make_identity_pre_mix: the first sublayer collapses the streams onto stream 0."""
    m = torch.zeros(n, hc, dtype=F64)
    m[:, 0] = 1.0
    return m


def collapse(X, pre_mix):
    """Block.hc_pre with a given mix: sum_j pre_mix[j] X[j], f32 sum rounded to bf16."""
    return bf16((pre_mix[:, :, None] * X).sum(1))


def candidate_blocks(score, done, topk_blocks, bs):
    """select_candidate_blocks, per query: a block of `bs` rows scores its best row; the
    block holding the query's newest reachable row (done - 1) is always kept; the best
    `topk_blocks` blocks with a finite score are kept. Returns a bool mask shaped like score."""
    n, W = score.shape
    nb = -(-W // bs)
    padded = torch.full((n, nb * bs), NEG_INF, dtype=F64)
    padded[:, :W] = score
    bscore = padded.reshape(n, nb, bs).amax(-1)
    last = torch.div(done - 1, bs, rounding_mode="floor")
    bscore = torch.where(torch.arange(nb)[None, :] == last[:, None], torch.tensor(float("inf"), dtype=F64), bscore)
    keep = torch.zeros(n, nb, dtype=torch.bool)
    top = topk_stable(bscore, min(topk_blocks, nb))
    keep.scatter_(1, top, bscore.gather(1, top) > NEG_INF)
    return keep.repeat_interleave(bs, dim=1)[:, :W]


def select_topk(score, k):
    """Per query the best min(k, #finite) rows, ascending row ids (lists)."""
    out = []
    for row in score:
        m = min(k, int(torch.isfinite(row).sum()))
        out.append(sorted(topk_stable(row, m).tolist()) if m else [])
    return out


def padded_ids(sel, k):
    """Selections (lists of row ids) -> I32 [n, k], -1 padded (for the recorder)."""
    out = torch.full((len(sel), k), -1, dtype=torch.int32)
    for i, s in enumerate(sel):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.int32)
    return out


# ============================================================================ state


class LayerStateV41:
    """Rows one main layer keeps: every window KV row; on a kv source the compressor inputs
    (ratio 2), the compressed KV rows and the index keys, which later layers read."""

    def __init__(self, cfg, il):
        k = cfg.kinds[il]
        self.kv = Rows(cfg.head_dim)
        self.comp = self.idx = self.a = self.g = None
        if k.kv_source == il:
            self.comp = Rows(cfg.head_dim)
            self.idx = Rows(cfg.index_head_dim)
            if k.ratio > 1:
                self.a, self.g = Rows(cfg.head_dim), Rows(cfg.head_dim)


class StateV41:
    """Everything a V4.1 sequence carries between forward calls."""

    def __init__(self, cfg):
        self.pos = 0
        self.tokens = []
        self.layers = [LayerStateV41(cfg, i) for i in range(cfg.n_layers)]
        n_t = max(1, len(cfg.dspark_targets))
        self.main_hidden = Rows(n_t * cfg.dim)                   # DSpark input per position
        self.rings = [Rows(cfg.head_dim) for _ in range(cfg.n_mtp_layers)]  # DSpark window KV
        self.spec_pos = 0                                        # DSpark rows done
        self.published = -1   # kv source that published index keys last (official decode only)


class Shared:
    """SharedAttentionRuntime for one forward call: the latest index source's selection and
    the candidate source's mask, handed down the layers of the call."""

    def __init__(self):
        self.topk = None
        self.cand = None


# ============================================================================ the model


class ModelV41(mdl.Model):
    official_decode_keys = False    # True: the official decode bug (tests only; see header)

    def __init__(self, cfg, weights, token_map=None):
        super().__init__(cfg, weights, Revision("current"))
        self.act_block = cfg.act_block
        self.has_dspark = cfg.n_mtp_layers > 0 and weights.has("mtp.0.main_proj.weight")
        self._engram_setup(token_map)

    def prefix(self, il):
        c = self.cfg
        return f"layers.{il}." if il < c.n_layers else f"mtp.{il - c.n_layers}."

    # ------------------------------------------------------------------ Engram

    def _engram_setup(self, token_map):
        """Token map (unless given: the checkpoint's engram_token_map.json, else computed from its
        tokenizer.json by engram_map_ref.py), multipliers, primes
        and offsets of docs/ENGRAM.md, computed by engram_ref.py."""
        c = self.cfg
        if not c.engram_layers:
            return
        path = os.path.join(self.w.model_dir, "engram_token_map.json")
        if token_map is None and os.path.exists(path):
            with open(path) as f:
                token_map = json.load(f)
        elif token_map is None:  # as dsv4: the file wins, else the map from tokenizer.json
            token_map, _ = engram_map_ref.build_map(
                engram_map_ref.load_tokens(os.path.join(self.w.model_dir, "tokenizer.json")))
        tm = np.array(token_map, dtype=np.int64)
        if tm.ndim != 1 or len(tm) <= c.engram_pad_id or tm.min() < 0 or tm.max() >= c.engram_cvocab:
            raise ValueError("engram_token_map.json: one compressed id in [0, C) per token expected")
        N, H = c.engram_max_ngram, c.engram_n_heads
        self.e_map, self.e_pad = tm, int(tm[c.engram_pad_id])
        self.e_mult = engram_ref.multipliers(c.engram_layers, N, c.engram_cvocab)
        self.e_primes = engram_ref.primes(len(c.engram_layers), N, H, c.engram_vocab)
        self.e_offs = engram_ref.offsets(self.e_primes)
        for rows, pr in zip(c.engram_rows, self.e_primes):
            if rows < sum(pr):
                raise ValueError(f"engram_num_embeddings {rows}: below the sum of its primes {sum(pr)}")

    def engram_rows(self, st, n):
        """Row ids [n, engram layers, (N-1) H] of the last n positions (the whole sequence is
        hashed again: the n-grams reach back N-1 tokens into earlier calls)."""
        c = self.cfg
        toks = np.array(st.tokens, dtype=np.int64)
        if toks.max() >= len(self.e_map):
            raise ValueError(f"token {toks.max()} is not in engram_token_map.json ({len(self.e_map)} tokens)")
        ids = self.e_map[toks].tolist()
        rows = engram_ref.indices(ids, self.e_pad, self.e_mult, self.e_primes, self.e_offs,
                                  c.engram_max_ngram, c.engram_n_heads)
        return torch.tensor(rows[len(ids) - n:], dtype=torch.int64)

    def engram(self, X, rows, pre):
        """Engram.forward: the rows (FP8, an e8m0 scale per 32, dequantised to bf16) go through
        wkv to one key per hc copy plus a value; per copy a gate from the normalised dot of
        stream and key (signed sqrt, sigmoid) adds gate x value to the stream."""
        c = self.cfg
        n, hc, d = X.shape
        e = bf16(self.w.rows_fp8(pre + "engram.embed", rows))
        kv = self.linear(e.reshape(n, -1), pre + "engram.wkv")
        key, value = kv[:, :hc * d].reshape(n, hc, d), kv[:, hc * d:]
        wgt = f32(self.t(pre + "engram.q_weight") * self.t(pre + "engram.k_weight"))

        def rstd(v):   # per (token, copy) over d, not jointly over the copies
            return f32(1.0 / torch.sqrt(f32(f32((v * v).mean(-1)) + c.norm_eps)))

        dot = f32(f32(f32((X * wgt * key).sum(-1)) * f32(rstd(X) * rstd(key))) * f32c(d ** -0.5))
        mag = f32(torch.sqrt(torch.clamp(dot.abs(), min=f32c(1e-6))))
        gate = f32(torch.sigmoid(torch.copysign(mag, dot)))
        return bf16(X + gate[:, :, None] * value[:, None, :])

    # ------------------------------------------------------------------ hyper-connections

    def hc_mixes(self, X, name):
        """Block.hc_mixes: pre, post, comb of one sublayer from the streams X."""
        mix = self.hc_mix_logits(X, self.t(name + "_fn"))
        return self.sinkhorn_split(mix, self.t(name + "_scale"), self.t(name + "_base"))

    def block(self, il, X, pre_mix, attend, rec, tag):
        """Block.forward with lagged mixes: attention collapses X with `pre_mix` (the previous
        block's FFN mix), the FFN with the mix the attention sublayer computed; returns the
        streams and this block's FFN mix for the next block (docs/MODEL.md §6 item 4)."""
        pre, eps = self.prefix(il), self.cfg.norm_eps
        a_pre, a_post, a_comb = self.hc_mixes(X, pre + "hc_attn")
        u = rmsnorm(collapse(X, pre_mix), self.t(pre + "attn_norm.weight"), eps)
        rec.add(tag + "attn_in", u)
        X = self.hc_post(attend(u), X, a_post, a_comb)
        rec.add(tag + "x_attn", X)
        f_pre, f_post, f_comb = self.hc_mixes(X, pre + "hc_ffn")
        u = rmsnorm(collapse(X, a_pre), self.t(pre + "ffn_norm.weight"), eps)
        rec.add(tag + "ffn_in", u)
        X = self.hc_post(self.moe_v41(pre, il, u, rec, tag), X, f_post, f_comb)
        rec.add(tag + "x_out", X)
        return X, f_pre

    # ------------------------------------------------------------------ attention pieces

    def query(self, pre, u, pos, freqs):
        """q = wq_b(q_norm(wq_a(u))) with RoPE; no per-head RMS (docs/MODEL.md §6 item 5)."""
        c = self.cfg
        qr = rmsnorm(self.linear(u, pre + "attn.wq_a"), self.t(pre + "attn.q_norm.weight"), c.norm_eps)
        q = self.linear(qr, pre + "attn.wq_b").reshape(len(pos), c.n_heads, c.head_dim)
        return with_rope(q, pos, freqs, c.rope_head_dim), qr

    def window_kv(self, pre, u, pos, freqs):
        """_window_kv: kv_norm(wkv(u)) with RoPE, FP8 per 32 over the whole row."""
        c = self.cfg
        kv = rmsnorm(self.linear(u, pre + "attn.wkv"), self.t(pre + "attn.kv_norm.weight"), c.norm_eps)
        return nx.fp8_sim(with_rope(kv, pos, freqs, c.rope_head_dim), self.act_block)

    def attend_out(self, pre, q, pool, sel, pos, freqs):
        """Sparse attention with the sink, inverse RoPE, grouped output projection."""
        c = self.cfg
        o = self.sparse_attn(q, pool, sel, self.t(pre + "attn.attn_sink"), c.head_dim ** -0.5)
        return self.out_proj(pre, with_rope(o, pos, freqs, c.rope_head_dim, inverse=True))

    def window_sets(self, pos):
        lo = torch.clamp(pos - self.cfg.window_size + 1, min=0)
        return [list(range(int(lo[i]), int(pos[i]) + 1)) for i in range(len(pos))]

    # ------------------------------------------------------------------ compressor, indexer

    def compress(self, st, il, u, pos):
        """Compressor.forward on a kv source, for the groups this chunk completes: the latent
        (before RoPE), the index keys k_norm(wk(latent)) (RoPE, FP4 per 32, e8m0 scales) and
        the compressed KV rows (RoPE, FP4 per 16, e4m3 scales). Group j stands at j x ratio."""
        c, ls, r = self.cfg, st.layers[il], self.cfg.kinds[il].ratio
        pre, rd = f"layers.{il}.attn.", c.rope_head_dim
        if r == 1:   # one token per group: norm(wkv(u)), bf16 weights
            latent = rmsnorm(self.linear(u, pre + "compressor.wkv"), self.t(pre + "compressor.norm.weight"), c.norm_eps)
            groups = pos
        else:        # softmax gate over each group of r tokens, in f32
            ls.a.append(f32(mm(u, self.w.dense(pre + "compressor.wkv")[0])))
            ls.g.append(f32(mm(u, self.w.dense(pre + "compressor.wgate")[0])))
            p0 = int(pos[0])
            groups = torch.arange(p0 // r, (p0 + len(pos)) // r)
            if len(groups) == 0:
                return
            cur = groups[:, None] * r + torch.arange(r)[None, :]
            A, G = ls.a.all()[cur], ls.g.all()[cur]
            pooled = f32((torch.softmax(G, dim=1) * A).sum(1))
            latent = rmsnorm(bf16(pooled), self.t(pre + "compressor.norm.weight"), c.norm_eps)
        gpos, freqs = groups * r, self.freqs(r)
        keys = rmsnorm(self.linear(latent, pre + "indexer.wk"), self.t(pre + "indexer.k_norm.weight"), c.norm_eps)
        ls.idx.append(nx.fp4_sim(with_rope(keys, gpos, freqs, rd), 32))
        ls.comp.append(nx.fp4_sim_e4m3(with_rope(latent, gpos, freqs, rd), 16))
        st.published = il

    def index_keys(self, st, il, pos):
        """The keys an index source scores: its kv source's (prefill semantics), or in the
        official decode (a one-token call after the first) the keys published last."""
        src = self.cfg.kinds[il].kv_source
        if self.official_decode_keys and len(pos) == 1 and int(pos[0]) > 0:
            src = st.published
        return st.layers[src].idx.all()

    def indexer(self, st, il, u, qr, pos, sh, rec, tag):
        """Indexer.forward on an index source: FP4 queries (no Hadamard) against the kv
        source's keys; the candidate source publishes its candidate blocks, later indexers
        score only inside them. Returns the selected rows per query."""
        c, k = self.cfg, self.cfg.kinds[il]
        pre, r = f"layers.{il}.attn.indexer.", k.ratio
        q = self.linear(qr, pre + "wq_b").reshape(len(pos), c.index_n_heads, c.index_head_dim)
        q = nx.fp4_sim(with_rope(q, pos, self.freqs(r), c.rope_head_dim), 32)
        K = self.index_keys(st, il, pos)
        if K.shape[0] == 0:
            return [[] for _ in range(len(pos))]
        done = (pos + 1) // r
        score = mdl.index_scores(q, K, self.index_weights(u, pre + "weights_proj"), done)
        if k.cand == "source":
            sh.cand = candidate_blocks(score, done, c.cand_topk_blocks, c.cand_block_size)
            rec.add(tag + "cand", sh.cand.to(torch.int32), pad=0)
        elif k.cand == "user":
            score = torch.where(sh.cand, score, torch.tensor(NEG_INF, dtype=F64))
        rec.add(tag + "idx_scores", score, pad=NEG_INF)
        return select_topk(score, c.index_topk)

    def attention(self, st, il, u, pos, sh, rec, tag):
        """Attention.forward of main layer il: window rows plus, at ratio > 0, the rows of
        its kv source selected by its index source."""
        k, pre = self.cfg.kinds[il], f"layers.{il}."
        freqs = self.freqs(k.ratio)
        q, qr = self.query(pre, u, pos, freqs)
        kv = self.window_kv(pre, u, pos, freqs)
        rec.add(tag + "kv", kv)
        ls = st.layers[il]
        ls.kv.append(kv)
        pool, sel = ls.kv.all(), self.window_sets(pos)
        if k.ratio:
            if k.kv_source == il:
                self.compress(st, il, u, pos)
            if k.index_source == il:
                sh.topk = self.indexer(st, il, u, qr, pos, sh, rec, tag)
            rec.add(tag + "idx_topk", padded_ids(sh.topk, self.cfg.index_topk), pad=-1)
            P = pool.shape[0]
            sel = [s + [P + j for j in t] for s, t in zip(sel, sh.topk)]
            pool = torch.cat([pool, self.comp_rows(st, il)], 0)
        o = self.attend_out(pre, q, pool, sel, pos, freqs)
        rec.add(tag + "attn_out", o)
        return o

    def comp_rows(self, st, il):
        """The compressed KV rows layer il attends over: its kv source's (a method so that the
        self-checks can replace them and see who reads them)."""
        return st.layers[self.cfg.kinds[il].kv_source].comp.all()

    # ------------------------------------------------------------------ MoE

    def moe_v41(self, pre, il, u, rec, tag):
        """MoE with Gate.forward of V4.1: logits / gate_temp, sqrt-softplus scores, biased
        top-k, weights normalised (+1e-20) and scaled; the shared expert always clamped."""
        c = self.cfg
        _, k = c.moe_config(il)
        logits = f32(f32(mm(u, self.t(pre + "ffn.gate.weight"))) / f32c(c.gate_temp))
        score = f32(torch.sqrt(f32(mdl.softplus(logits))))
        eids = topk_stable(f32(score + self.t(pre + "ffn.gate.bias")), k)
        w = score.gather(1, eids)
        if c.norm_topk_prob and k > 1:
            w = f32(w / f32(f32(w.sum(-1, keepdim=True)) + f32c(1e-20)))
        w = f32(w * c.route_scale)
        rec.add(tag + "router_ids", eids.to(torch.int32))
        rec.add(tag + "router_w", w)
        y = self.routed(pre, u, eids, w) + self.expert(u, pre + "ffn.shared_experts", c.swiglu_limit)
        return bf16(y)

    # ------------------------------------------------------------------ entry points

    def forward(self, st, ids, rec=NO_RECORD):
        """Main model on the next len(ids) tokens; returns logits [n, vocab] (f32 values).
        Also keeps the DSpark input (mean over hc of the target layers' inputs) and seeds the
        DSpark stages' window rings."""
        c = self.cfg
        ids = torch.as_tensor(ids, dtype=torch.int64)
        n = len(ids)
        pos = torch.arange(st.pos, st.pos + n)
        st.tokens += ids.tolist()
        hashes = self.engram_rows(st, n) if c.engram_layers else None
        X = self.t("embed.weight")[ids][:, None, :].repeat(1, c.hc_mult, 1)
        rec.add("tokens", ids.to(torch.int32))
        rec.add("embed", X[:, 0])
        pre_mix, sh, targets = identity_pre_mix(n, c.hc_mult), Shared(), []
        for il in range(c.n_layers):
            k = c.kinds[il]
            if k.engram >= 0:
                X = self.engram(X, hashes[:, k.engram], f"layers.{il}.")
                rec.add(f"L{il}.engram_rows", hashes[:, k.engram].to(torch.int32))
                rec.add(f"L{il}.x_engram", X)
            if il in c.dspark_targets:   # the attention input of the target layers
                targets.append(bf16(X.mean(1)))
            def attend(u, il=il):
                return self.attention(st, il, u, pos, sh, rec, f"L{il}.")
            X, pre_mix = self.block(il, X, pre_mix, attend, rec, f"L{il}.")
        y = rmsnorm(collapse(X, pre_mix), self.t("norm.weight"), c.norm_eps)
        logits = f32(mm(y, self.t("head.weight")))
        rec.add("final_hidden", y)
        rec.add("logits", logits)
        st.pos += n
        if self.has_dspark:
            st.main_hidden.append(torch.cat(targets, -1))
            self.seed_rings(st, pos)
        return logits

    # ------------------------------------------------------------------ DSpark

    def seed_rings(self, st, pos):
        """main_x = main_norm(main_proj(main hidden)) at the new positions; each stage adds
        kv_norm(wkv(main_x)) (RoPE at the position, FP8 per 32) to its own window ring."""
        c = self.cfg
        mh = st.main_hidden.all()[int(pos[0]):]
        main_x = rmsnorm(self.linear(mh, "mtp.0.main_proj"), self.t("mtp.0.main_norm.weight"), c.norm_eps)
        for s in range(c.n_mtp_layers):
            st.rings[s].append(self.window_kv(f"mtp.{s}.", main_x, pos, self.freqs_swa))

    def dspark_attention(self, st, s, u, t, posd):
        """DSparkAttention at main position t: the draft block (positions t+1..t+B) attends
        over the stage's ring (main positions t-win+1..t) and over the whole block."""
        pre, win = f"mtp.{s}.", self.cfg.window_size
        q, _ = self.query(pre, u, posd, self.freqs_swa)
        ring = st.rings[s].all()[max(0, t - win + 1):t + 1]
        pool = torch.cat([ring, self.window_kv(pre, u, posd, self.freqs_swa)], 0)
        sel = [list(range(pool.shape[0]))] * len(posd)       # not causal inside the block
        return self.attend_out(pre, q, pool, sel, posd, self.freqs_swa)

    def dspark_head(self, X, pre_mix, tok):
        """forward_head: logits of the B drafts, each plus the Markov bias of the token before
        it (the input token, then the previous draft, taken as the argmax), and the
        confidence of each draft from [hidden, Markov embedding]."""
        c = self.cfg
        L = f"mtp.{c.n_mtp_layers - 1}."
        y = collapse(X, pre_mix)
        logits = f32(mm(rmsnorm(y, self.t(L + "norm.weight"), c.norm_eps), self.t("head.weight")))
        E, Wm = self.t(L + "markov_head.embed.weight"), self.t(L + "markov_head.head.weight")
        prev, embs = tok, []
        for i in range(c.dspark_block):
            embs.append(E[prev])
            logits[i] = f32(logits[i] + f32(mm(E[prev][None], Wm))[0])
            prev = int(torch.argmax(logits[i]))
        conf = f32(mm(torch.cat([y, torch.stack(embs)], -1), self.t(L + "confidence_head.proj.weight")))[:, 0]
        return logits, conf

    def draft(self, st, t, tok):
        """forward_spec after main position t with input token tok: the block [tok, noise..]
        through every stage; returns (logits [B, vocab], confidence [B])."""
        c = self.cfg
        B = c.dspark_block
        ids = torch.tensor([tok] + [c.dspark_noise_id] * (B - 1), dtype=torch.int64)
        X = self.t("embed.weight")[ids][:, None, :].repeat(1, c.hc_mult, 1)
        posd = torch.arange(t + 1, t + 1 + B)
        pre_mix = identity_pre_mix(B, c.hc_mult)
        for s in range(c.n_mtp_layers):
            def attend(u, s=s):
                return self.dspark_attention(st, s, u, t, posd)
            X, pre_mix = self.block(c.n_layers + s, X, pre_mix, attend, NO_RECORD, "")
        return self.dspark_head(X, pre_mix, tok)

    def forward_spec(self, st):
        """DSpark rows for every position t not yet done whose next token is known (t <=
        pos - 2): (logits [m, B, vocab], confidence [m, B])."""
        c = self.cfg
        rows = [self.draft(st, t, st.tokens[t + 1]) for t in range(st.spec_pos, st.pos - 1)]
        st.spec_pos = max(st.spec_pos, st.pos - 1)
        if not rows:
            return (torch.zeros(0, c.dspark_block, c.vocab_size, dtype=F64),
                    torch.zeros(0, c.dspark_block, dtype=F64))
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    def record_rows(self, st, rec):
        """Compressed rows and index keys of every kv source, over the whole sequence."""
        for i, ls in enumerate(st.layers):
            if ls.comp is not None and ls.comp.n:
                rec.set(f"L{i}.comp", ls.comp.all())
                rec.set(f"L{i}.idx_keys", ls.idx.all())


def run(model, tokens, prefill=None, dspark=False, rec=NO_RECORD):
    """Call schedule: tokens[:prefill] in one call, then one token per call. Returns
    (logits [T, V], DSpark (logits [T-1, B, V], confidence [T-1, B]) or None)."""
    T = len(tokens)
    N = T if prefill is None else max(1, min(prefill, T))
    st = StateV41(model.cfg)
    rows, spec = [model.forward(st, tokens[:N], rec)], []
    if dspark:
        spec.append(model.forward_spec(st))
    for t in range(N, T):
        rows.append(model.forward(st, tokens[t:t + 1], rec))
        if dspark:
            spec.append(model.forward_spec(st))
    model.record_rows(st, rec)
    logits = torch.cat(rows, 0)
    if not dspark:
        return logits, None
    return logits, (torch.cat([s[0] for s in spec], 0), torch.cat([s[1] for s in spec], 0))
