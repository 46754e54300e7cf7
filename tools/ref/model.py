"""model.py - the DeepSeek-V4 forward pass, as the official demo computes it.

Owns: the whole forward of docs/MODEL.md §R3 for one sequence: embedding, mHC hyper-connections
(Sinkhorn, hc_head), the three attention kinds (sliding window; CSA = overlapping ratio-4
compressor + lightning indexer; HCA = non-overlapping compressor, all rows), attention sinks,
per-head q RMS, RoPE/YaRN, grouped output projection, hash and sqrt-softplus routing, SwiGLU
experts with clamps, final norm and head, and the MTP block; plus the per-sequence state
(KV rows, compressor inputs, compressed rows) carried between calls.

Numerics follow the demo's dtype boundaries (see numerics.py): bf16 tensors between ops,
f32 where the demo upcasts, act_quant before every FP8/FP4 linear, FP8 simulation of cached
KV nope dims, FP4 simulation of indexer q/k after the Hadamard, indexer scores rounded to
bf16 at four points, attention probabilities rounded to bf16 before P.V. Sums are taken in
float64 (more exact than the demo's f32, and independent of chunking).

Deliberate differences from the demo (docs/MODEL.md §R3.6, §R10, §R11):
  * chunk-consistent: any split of a sequence into calls gives the same values (the demo's
    prefill and decode attention differ through its per-64-block running max, §11.1; here
    the softmax max is taken over the whole index set of a query);
  * compressor state starts clean (value 0 / gate -inf), also for prompts under 4 tokens;
  * ties: routing top-k and indexer top-k prefer the lower index (stable sort);
  * the state keeps every raw KV row and compressor input instead of rings; the window and
    block rules select exactly the rows the demo's rings would hold.
"""

import math

import torch

import numerics as nx
from numerics import bf16, f32

F64 = torch.float64

# Accumulation dtype of every dot product. float64 (default) makes the reference independent
# of summation order; test_ref.py sets float32 to measure the noise an f32 engine will show.
ACC = torch.float64


def mm(x, W):
    """x @ W^T, accumulated in ACC, returned as float64."""
    return (x.to(ACC) @ W.to(ACC).T).to(F64)


def ein(eq, *ops):
    """torch.einsum accumulated in ACC, returned as float64."""
    return torch.einsum(eq, *[o.to(ACC) for o in ops]).to(F64)


# ============================================================================ small pieces


class Rows:
    """A growable [n, width] float64 buffer (KV rows, compressor inputs, compressed rows)."""

    def __init__(self, width):
        self.buf = torch.zeros(64, width, dtype=F64)
        self.n = 0

    def append(self, x):
        need = self.n + x.shape[0]
        if need > self.buf.shape[0]:
            cap = max(need, 2 * self.buf.shape[0])
            nb = torch.zeros(cap, self.buf.shape[1], dtype=F64)
            nb[:self.n] = self.buf[:self.n]
            self.buf = nb
        self.buf[self.n:need] = x
        self.n = need

    def all(self):
        return self.buf[:self.n]


def rmsnorm(x, weight, eps):
    """Weighted RMSNorm over the last dim: f32 math, bf16 out."""
    r = 1.0 / torch.sqrt(f32((x * x).mean(-1, keepdim=True)) + eps)
    return bf16(weight * (x * r))


def head_rms(q, eps):
    """Unweighted per-head RMS of the query, each step rounded to bf16 as in the demo's
    `q *= rsqrt(q.square().mean(-1) + eps)` on a bf16 tensor (docs/MODEL.md §R11.5)."""
    sq = bf16(q * q)
    m = bf16(sq.mean(-1, keepdim=True))
    m = bf16(m + eps)
    r = bf16(1.0 / torch.sqrt(m))
    return bf16(q * r)


def rope_freqs(dim, base, original_seq_len, factor, beta_fast, beta_slow):
    """Per-pair frequencies f_i (f32 values) with the YaRN ramp when original_seq_len > 0."""
    i = torch.arange(0, dim, 2, dtype=F64)
    freqs = f32(1.0 / f32(torch.tensor(base, dtype=F64) ** f32(i / dim)))
    if original_seq_len > 0:
        def corr(n_rot):
            return dim * math.log(original_seq_len / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = f32(torch.clamp((torch.arange(dim // 2, dtype=F64) - low) / (high - low), 0, 1))
        smooth = 1 - ramp
        freqs = f32(f32(freqs / factor) * f32(1 - smooth) + f32(freqs * smooth))
    return freqs


def rope(x, pos, freqs, inverse=False):
    """Interleaved RoPE on x[..., R] (pairs (2i, 2i+1)) for positions pos [n] (x is [n, R] or
    [n, h, R]); angle = f32(p * f_i), cos/sin in f32, result bf16."""
    ang = f32(pos.to(F64)[:, None] * freqs[None, :])
    c, s = f32(torch.cos(ang)), f32(torch.sin(ang))
    if inverse:
        s = -s
    while c.dim() < x.dim():
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y = torch.empty_like(x)
    y[..., 0::2] = x0 * c - x1 * s
    y[..., 1::2] = x0 * s + x1 * c
    return bf16(y)


def with_rope(x, pos, freqs, rd, inverse=False):
    """x with RoPE applied to its last rd dims ("nope first, rope last")."""
    y = x.clone()
    y[..., -rd:] = rope(x[..., -rd:], pos, freqs, inverse)
    return y


def softplus(x):
    """torch's F.softplus (beta 1, threshold 20)."""
    return torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20))))


def topk_stable(scores, k):
    """Indices of the k largest values per row, largest first, ties to the lower index."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True)[1]
    return order[..., :k]


def index_scores(q, K, w, done):
    """Indexer scores [n, Nc] of queries q [n, nI, dI] against key rows K [Nc, dI] with head
    weights w [n, nI], rounded to bf16 at the demo's three points (each q.k, each weighted
    head, the sum over heads); -inf for rows j >= done[i] (blocks not completed at i)."""
    s = bf16(ein("nhd,jd->nhj", q, K))
    s = bf16(torch.relu(s) * w[:, :, None])
    score = bf16(s.sum(1))
    valid = torch.arange(K.shape[0])[None, :] < done[:, None]
    return torch.where(valid, score, torch.tensor(float("-inf"), dtype=F64))


# ============================================================================ recorder


class Recorder:
    """Collects named intermediates for `dump`: one list of chunks per stage, joined along
    positions at the end. Chunks with a ragged last dim are padded (pad value per stage)."""

    def __init__(self):
        self.stages = {}
        self.pads = {}

    def add(self, name, value, pad=None):
        self.stages.setdefault(name, []).append(value.detach().clone())
        if pad is not None:
            self.pads[name] = pad

    def set(self, name, value):
        self.stages[name] = [value.detach().clone()]

    def result(self):
        out = {}
        for name, parts in self.stages.items():
            if name in self.pads:
                width = max(p.shape[-1] for p in parts)
                parts = [torch.nn.functional.pad(p, (0, width - p.shape[-1]), value=self.pads[name])
                         if p.shape[-1] < width else p for p in parts]
            out[name] = torch.cat(parts, 0)
        return out


class _NoRecord:
    def add(self, *a, **k):
        pass

    def set(self, *a, **k):
        pass


NO_RECORD = _NoRecord()


# ============================================================================ state


class CompressorState:
    """Inputs of one compressor for every position so far (a_t, g_t incl. ape, f32 values)
    and the compressed rows emitted so far."""

    def __init__(self, width_in, width_out):
        self.a = Rows(width_in)
        self.g = Rows(width_in)
        self.rows = Rows(width_out)


class LayerState:
    def __init__(self, cfg, ratio):
        self.kv = Rows(cfg.head_dim)                     # every raw KV row (window = last win)
        self.ratio = ratio
        coff = 2 if ratio == 4 else 1
        self.comp = CompressorState(coff * cfg.head_dim, cfg.head_dim) if ratio else None
        self.idx = CompressorState(coff * cfg.index_head_dim, cfg.index_head_dim) if ratio == 4 else None


class State:
    """Everything a sequence carries between forward calls."""

    def __init__(self, cfg):
        self.pos = 0                                     # tokens processed by the main model
        self.tokens = []
        self.layers = [LayerState(cfg, cfg.ratio(i)) for i in range(cfg.n_layers)]
        self.final_streams = Rows(cfg.hc_mult * cfg.dim)  # main last-layer streams (MTP input)
        self.mtp_pos = 0                                 # MTP positions processed
        self.mtp_layers = [LayerState(cfg, cfg.ratio(cfg.n_layers + k)) for k in range(cfg.n_mtp_layers)]


# ============================================================================ the model


class Model:
    act_block = 128      # activations quantised per 128 before FP8/FP4 linears (V4.1: 32)

    def __init__(self, cfg, weights, revision):
        self.cfg, self.w, self.rev = cfg, weights, revision
        c = cfg
        self.freqs_swa = rope_freqs(c.rope_head_dim, c.rope_theta, 0, 1.0, c.beta_fast, c.beta_slow)
        self.freqs_comp = rope_freqs(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len,
                                     c.rope_factor, c.beta_fast, c.beta_slow)
        self.has_mtp = c.n_mtp_layers > 0 and weights.has("mtp.0.e_proj.weight")

    # ------------------------------------------------------------------ helpers

    def t(self, name):
        return self.w.tensor(name)

    def linear(self, x, prefix):
        """A checkpoint linear on a bf16 input: act_quant (e4m3, act_block blocks) when the
        weight is FP8/FP4, product summed exactly, output rounded to bf16."""
        W, quant = self.w.dense(prefix)
        if quant:
            x = nx.act_quant(x, self.act_block)
        return bf16(mm(x, W))

    def freqs(self, ratio):
        return self.freqs_comp if ratio else self.freqs_swa

    # ------------------------------------------------------------------ hyper-connections

    def sinkhorn_split(self, mix, scale, base):
        """pre [n, hc], post [n, hc], comb [n, hc, hc] from the mix logits (all f32)."""
        hc, eps, iters = self.cfg.hc_mult, self.cfg.hc_eps, self.cfg.hc_sinkhorn_iters
        pre = f32(torch.sigmoid(f32(mix[:, :hc] * scale[0] + base[:hc])) + eps)
        post = f32(2 * torch.sigmoid(f32(mix[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])))
        c = f32(mix[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(-1, hc, hc)
        c = torch.softmax(c, dim=-1) + eps                       # rows: source stream j
        c = c / (c.sum(-2, keepdim=True) + eps)                  # columns: destination k
        for _ in range(iters - 1):
            c = c / (c.sum(-1, keepdim=True) + eps)
            c = c / (c.sum(-2, keepdim=True) + eps)
        return pre, post, f32(c)

    def hc_mix_logits(self, X, fn):
        n = X.shape[0]
        xf = X.reshape(n, -1)
        r = f32(1.0 / torch.sqrt(f32((xf * xf).mean(-1, keepdim=True)) + self.cfg.norm_eps))
        return f32(f32(mm(xf, fn)) * r)

    def hc_pre(self, X, pre_name):
        mix = self.hc_mix_logits(X, self.t(pre_name + "_fn"))
        pre, post, comb = self.sinkhorn_split(mix, self.t(pre_name + "_scale"), self.t(pre_name + "_base"))
        u = bf16((pre[:, :, None] * X).sum(1))
        return u, pre, post, comb

    @staticmethod
    def hc_post(f, residual, post, comb):
        """X_new[k] = post[k] * f + sum_j comb[j][k] * residual[j]   (bf16)."""
        return bf16(post[:, :, None] * f[:, None, :] + ein("njk,njd->nkd", comb, residual))

    def hc_head(self, X, prefix):
        mix = self.hc_mix_logits(X, self.t(prefix + "hc_head_fn"))
        w = f32(torch.sigmoid(f32(mix * self.t(prefix + "hc_head_scale") + self.t(prefix + "hc_head_base")))
                + self.cfg.hc_eps)
        return bf16((w[:, :, None] * X).sum(1))

    # ------------------------------------------------------------------ compressor

    def compress(self, cs, prefix, u, pos, ratio, Dc, freqs, kind):
        """Feeds positions pos (one chunk) into compressor `prefix`; emits the rows of every
        block completed in this chunk (ascending). kind: "main" (FP8 sim of the nope dims) or
        "index" (Hadamard + FP4 sim). Returns the new rows [m, Dc] (possibly m = 0)."""
        cfg = self.cfg
        rd = cfg.rope_head_dim
        uf = u                                            # bf16 values, used as f32
        a = f32(mm(uf, self.t(prefix + ".wkv.weight")))
        ape = self.t(prefix + ".ape")
        g = f32(f32(mm(uf, self.t(prefix + ".wgate.weight"))) + ape[pos % ratio])
        p0 = int(pos[0])
        cs.a.append(a)
        cs.g.append(g)
        first, last = p0 // ratio, (p0 + len(pos)) // ratio
        if last <= first:
            return torch.zeros(0, Dc, dtype=F64)
        A, G = cs.a.all(), cs.g.all()
        blocks = torch.arange(first, last)
        cur = blocks[:, None] * ratio + torch.arange(ratio)[None, :]          # [nb, r]
        if ratio == 4:   # overlap: previous block's first half + this block's second half
            va = torch.zeros(len(blocks), 2 * ratio, Dc, dtype=F64)
            vg = torch.full((len(blocks), 2 * ratio, Dc), float("-inf"), dtype=F64)
            va[:, ratio:], vg[:, ratio:] = A[cur][..., Dc:], G[cur][..., Dc:]
            has_prev = blocks > 0
            prev = (cur - ratio)[has_prev]
            va[has_prev, :ratio], vg[has_prev, :ratio] = A[prev][..., :Dc], G[prev][..., :Dc]
        else:
            va, vg = A[cur], G[cur]
        pooled = f32((torch.softmax(vg, dim=1) * va).sum(1))              # [nb, Dc]
        rows = rmsnorm(bf16(pooled), self.t(prefix + ".norm.weight"), cfg.norm_eps)
        rows = with_rope(rows, blocks * ratio, freqs, rd)
        if kind == "main":
            if self.rev.kv_fp8_sim:
                rows[:, :Dc - rd] = nx.fp8_sim(rows[:, :Dc - rd], 64)
        else:
            rows = nx.fp4_sim(nx.hadamard(rows), 32)
        cs.rows.append(rows)
        return rows

    # ------------------------------------------------------------------ indexer

    def indexer(self, ls, pre, u, qr, pos, freqs, rec, tag):
        """Lightning indexer of a CSA layer: top-k compressed rows per query (ascending ids,
        -1 padded to index_topk)."""
        cfg = self.cfg
        nI, dI, rd, ratio = cfg.index_n_heads, cfg.index_head_dim, cfg.rope_head_dim, 4
        n = len(pos)
        q = self.linear(qr, pre + "attn.indexer.wq_b").reshape(n, nI, dI)
        q = with_rope(q, pos, freqs, rd)
        q = nx.fp4_sim(nx.hadamard(q), 32)
        self.compress(ls.idx, pre + "attn.indexer.compressor", u, pos, ratio, dI, freqs, "index")
        w = self.index_weights(u, pre + "attn.indexer.weights_proj")             # [n, nI]
        K = ls.idx.rows.all()                                                    # [Nc, dI]
        done = (pos + 1) // ratio                                                # completed blocks
        topk = torch.full((n, cfg.index_topk), -1, dtype=torch.int64)
        if K.shape[0] == 0:
            rec.add(tag + "idx_scores", torch.full((n, 1), float("-inf"), dtype=F64), pad=float("-inf"))
            return topk
        score = index_scores(q, K, w, done)
        rec.add(tag + "idx_scores", score, pad=float("-inf"))
        for i in range(n):
            k = min(cfg.index_topk, int(done[i]))
            if k:
                topk[i, :k] = torch.sort(topk_stable(score[i], k))[0]
        return topk

    def index_weights(self, u, prefix):
        """Per-head weights of the indexer: weights_proj(u) x dI^-0.5 nI^-0.5 (bf16)."""
        c = self.cfg
        wscale = torch.tensor(c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5, dtype=torch.float32).item()
        return bf16(self.linear(u, prefix) * wscale)

    # ------------------------------------------------------------------ attention

    def attention(self, ls, pre, ratio, u, pos, rec, tag):
        cfg = self.cfg
        H, D, rd = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim
        N = D - rd
        n = len(pos)
        freqs = self.freqs(ratio)
        qr = rmsnorm(self.linear(u, pre + "attn.wq_a"), self.t(pre + "attn.q_norm.weight"), cfg.norm_eps)
        q = self.linear(qr, pre + "attn.wq_b").reshape(n, H, D)
        q = with_rope(head_rms(q, cfg.norm_eps), pos, freqs, rd)
        kv = rmsnorm(self.linear(u, pre + "attn.wkv"), self.t(pre + "attn.kv_norm.weight"), cfg.norm_eps)
        kv = with_rope(kv, pos, freqs, rd)
        if self.rev.kv_fp8_sim:
            kv[:, :N] = nx.fp8_sim(kv[:, :N], 64)
        rec.add(tag + "qr", qr)
        rec.add(tag + "q", q)
        rec.add(tag + "kv", kv)
        ls.kv.append(kv)

        # index sets: window rows + (CSA) indexer choice / (HCA) every completed block
        win = cfg.window_size
        lo = torch.clamp(pos - win + 1, min=0)
        sel = [list(range(int(lo[i]), int(pos[i]) + 1)) for i in range(n)]
        if ratio:
            if ratio == 4:
                topk = self.indexer(ls, pre, u, qr, pos, freqs, rec, tag)
                rec.add(tag + "idx_topk", topk.to(torch.int32))
                self.compress(ls.comp, pre + "attn.compressor", u, pos, ratio, D, freqs, "main")
                comp_sel = [[int(j) for j in topk[i] if j >= 0] for i in range(n)]
            else:
                self.compress(ls.comp, pre + "attn.compressor", u, pos, ratio, D, freqs, "main")
                comp_sel = [list(range(int(pos[i] + 1) // ratio)) for i in range(n)]
            P = ls.kv.n
            sel = [s + [P + j for j in c] for s, c in zip(sel, comp_sel)]
            pool = torch.cat([ls.kv.all(), ls.comp.rows.all()], 0)
        else:
            pool = ls.kv.all()

        o = self.sparse_attn(q, pool, sel, self.t(pre + "attn.attn_sink"), D ** -0.5)
        o = with_rope(o, pos, freqs, rd, inverse=True)
        rec.add(tag + "o", o)
        return self.out_proj(pre, o)

    def out_proj(self, pre, o):
        """Grouped low-rank output projection: wo_a per group (a bf16 einsum: convert.py
        dequantises wo_a to bf16), then wo_b."""
        cfg, n, G = self.cfg, o.shape[0], self.cfg.o_groups
        Wa, _ = self.w.dense(pre + "attn.wo_a", round_bf16=True)
        z = bf16(ein("ngd,grd->ngr", o.reshape(n, G, -1), Wa.reshape(G, cfg.o_lora_rank, -1)))
        return self.linear(z.reshape(n, -1), pre + "attn.wo_b")

    @staticmethod
    def sparse_attn(q, pool, sel, sink, scale):
        """Attention with a sink over per-query index sets (lists of pool rows). One max per
        query over its whole set; probabilities rounded to bf16 before P.V; the denominator
        sums the unrounded f32 exponentials plus exp(sink - max)."""
        n, H, D = q.shape
        M = max(len(s) for s in sel)
        idx = torch.full((n, M), -1, dtype=torch.int64)
        for i, s in enumerate(sel):
            idx[i, :len(s)] = torch.tensor(s, dtype=torch.int64)
        valid = idx >= 0
        K = pool[idx.clamp(min=0)]                                               # [n, M, D]
        scale32 = torch.tensor(scale, dtype=torch.float32).item()
        s = f32(f32(ein("nhd,nmd->nhm", q, K)) * scale32)
        s = torch.where(valid[:, None, :], s, torch.tensor(float("-inf"), dtype=F64))
        m = s.amax(-1, keepdim=True)
        e = f32(torch.exp(s - m))
        den = f32(e.sum(-1, keepdim=True)) + f32(torch.exp(sink[None, :, None] - m))
        p = bf16(e)
        return bf16(f32(ein("nhm,nmd->nhd", p, K)) / den)

    # ------------------------------------------------------------------ MoE

    def expert(self, x, prefix, limit, weight=None):
        g = self.linear(x, prefix + ".w1")
        v = self.linear(x, prefix + ".w3")
        if limit > 0:
            v = torch.clamp(v, -limit, limit)
            g = torch.clamp(g, max=limit)
        h = f32(f32(g * torch.sigmoid(g)) * v)                     # silu(gate) * up, f32
        if weight is not None:
            h = f32(weight[:, None] * h)
        return self.linear(bf16(h), prefix + ".w2")

    def moe(self, pre, layer_id, u, ids, rec, tag):
        cfg = self.cfg
        k = cfg.n_activated_experts
        logits = f32(mm(u, self.t(pre + "ffn.gate.weight")))
        score = f32(torch.sqrt(f32(softplus(logits))))
        if layer_id < cfg.n_hash_layers:
            eids = self.t(pre + "ffn.gate.tid2eid")[ids]
        else:
            eids = topk_stable(f32(score + self.t(pre + "ffn.gate.bias")), k)
        w = score.gather(1, eids)
        w = f32(w / f32(w.sum(-1, keepdim=True)))
        w = f32(w * cfg.route_scale)
        rec.add(tag + "router_ids", eids.to(torch.int32))
        rec.add(tag + "router_w", w)
        y = self.routed(pre, u, eids, w)
        shared_limit = cfg.swiglu_limit if self.rev.shared_clamp else 0.0
        y = y + self.expert(u, pre + "ffn.shared_experts", shared_limit)
        return bf16(y)

    def routed(self, pre, u, eids, w):
        """Sum over the selected experts of weight x expert(u), exact (float64)."""
        y = torch.zeros_like(u)
        for e in sorted(set(eids.flatten().tolist())):
            rows, slot = torch.where(eids == e)
            y[rows] += self.expert(u[rows], f"{pre}ffn.experts.{e}", self.cfg.swiglu_limit, w[rows, slot])
        return y

    # ------------------------------------------------------------------ block

    def block(self, ls, pre, layer_id, X, pos, ids, rec, tag):
        ratio = self.cfg.ratio(layer_id)
        u, hpre, post, comb = self.hc_pre(X, pre + "hc_attn")
        u = rmsnorm(u, self.t(pre + "attn_norm.weight"), self.cfg.norm_eps)
        rec.add(tag + "attn_hc_pre", hpre)
        rec.add(tag + "attn_hc_post", post)
        rec.add(tag + "attn_hc_comb", comb)
        rec.add(tag + "attn_in", u)
        f = self.attention(ls, pre, ratio, u, pos, rec, tag)
        rec.add(tag + "attn_out", f)
        X = self.hc_post(f, X, post, comb)
        rec.add(tag + "x_attn", X)

        u, hpre, post, comb = self.hc_pre(X, pre + "hc_ffn")
        u = rmsnorm(u, self.t(pre + "ffn_norm.weight"), self.cfg.norm_eps)
        rec.add(tag + "ffn_hc_pre", hpre)
        rec.add(tag + "ffn_hc_post", post)
        rec.add(tag + "ffn_hc_comb", comb)
        rec.add(tag + "ffn_in", u)
        f = self.moe(pre, layer_id, u, ids, rec, tag)
        rec.add(tag + "moe_out", f)
        X = self.hc_post(f, X, post, comb)
        rec.add(tag + "x_out", X)
        return X

    # ------------------------------------------------------------------ entry points

    def forward(self, state, ids, rec=NO_RECORD):
        """Main model on the next len(ids) tokens of the sequence; returns logits [n, vocab]
        (f32 values), one row per token."""
        cfg = self.cfg
        ids = torch.as_tensor(ids, dtype=torch.int64)
        n = len(ids)
        pos = torch.arange(state.pos, state.pos + n)
        h = self.t("embed.weight")[ids]
        rec.add("tokens", ids.to(torch.int32))
        rec.add("embed", h)
        X = h[:, None, :].repeat(1, cfg.hc_mult, 1)
        for i in range(cfg.n_layers):
            X = self.block(state.layers[i], f"layers.{i}.", i, X, pos, ids, rec, f"L{i}.")
        state.final_streams.append(X.reshape(n, -1))
        y = rmsnorm(self.hc_head(X, ""), self.t("norm.weight"), cfg.norm_eps)
        logits = f32(mm(y, self.t("head.weight")))
        rec.add("final_hidden", y)
        rec.add("logits", logits)
        state.pos += n
        state.tokens += ids.tolist()
        return logits

    def forward_mtp(self, state, rec=NO_RECORD):
        """The MTP block on every position t not yet done for which token t+1 is known:
        input = main last-layer streams at t and the embedding of token t+1, position t.
        Returns logits [m, vocab] (row t predicts token t+2)."""
        cfg = self.cfg
        t0, t1 = state.mtp_pos, state.pos - 1
        if not self.has_mtp or t1 <= t0:
            return torch.zeros(0, cfg.vocab_size, dtype=F64)
        pos = torch.arange(t0, t1)
        nxt = torch.tensor(state.tokens[t0 + 1:t1 + 1], dtype=torch.int64)
        pre = "mtp.0."
        e = rmsnorm(self.t("embed.weight")[nxt], self.t(pre + "enorm.weight"), cfg.norm_eps)
        XL = state.final_streams.all()[t0:t1].reshape(len(pos), cfg.hc_mult, cfg.dim)
        hh = rmsnorm(XL, self.t(pre + "hnorm.weight"), cfg.norm_eps)
        X = bf16(self.linear(e, pre + "e_proj")[:, None, :] + self.linear(hh, pre + "h_proj"))
        rec.add("mtp.embed", e)
        rec.add("mtp.x_in", X)
        X = self.block(state.mtp_layers[0], pre, cfg.n_layers, X, pos, nxt, rec, "mtp.")
        y = rmsnorm(self.hc_head(X, pre), self.t(pre + "norm.weight"), cfg.norm_eps)
        logits = f32(mm(y, self.t("head.weight")))
        rec.add("mtp.final_hidden", y)
        rec.add("mtp.logits", logits)
        state.mtp_pos = t1
        return logits

    def record_rows(self, state, rec):
        """Compressed rows and indexer key rows emitted over the whole sequence."""
        for i, ls in enumerate(state.layers):
            if ls.comp is not None and ls.comp.rows.n:
                rec.set(f"L{i}.comp", ls.comp.rows.all())
            if ls.idx is not None and ls.idx.rows.n:
                rec.set(f"L{i}.idx_keys", ls.idx.rows.all())


def run(model, tokens, prefill=None, mtp=False, rec=NO_RECORD):
    """Demo call schedule: tokens[:prefill] in one call, then one token per call. Returns
    (logits [T, V], mtp_logits [T-1, V] or None)."""
    T = len(tokens)
    N = T if prefill is None else max(1, min(prefill, T))
    state = State(model.cfg)
    rows, mrows = [model.forward(state, tokens[:N], rec)], []
    if mtp:
        mrows.append(model.forward_mtp(state, rec))
    for t in range(N, T):
        rows.append(model.forward(state, tokens[t:t + 1], rec))
        if mtp:
            mrows.append(model.forward_mtp(state, rec))
    model.record_rows(state, rec)
    logits = torch.cat(rows, 0)
    return logits, (torch.cat(mrows, 0) if mtp else None)
