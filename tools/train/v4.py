"""v4.py - a trainable float32 DeepSeek-V4 (the architecture of docs/MODEL.md §R3), for the
demo model.

Owns: the differentiable forward of the whole architecture on batches of whole sequences
(positions 0..T-1): embedding, mHC hyper-connections (Sinkhorn-projected residual mixing,
hc_head), the three attention kinds (sliding window; CSA = overlapping ratio-4 compressor
plus lightning indexer; HCA = non-overlapping compressor, every completed row), attention
sinks, per-head q RMS, interleaved RoPE on the last 64 dims with YaRN on compressed layers,
inverse RoPE of the output, grouped low-rank output projection, hash-routed and
sqrt-softplus score-routed MoE with the shared expert and the SwiGLU clamp, and the MTP
block. Parameter names are the release's tensor names (state_dict() keys = checkpoint
keys), so export is a rename-free quantisation.

It computes the function tools/ref/model.py computes, in float32 without the reference's
bf16 rounding points, with two training-only differences:
  * attention is evaluated densely with masks: the window as a band over the raw rows, the
    compressed rows with the "block completed" mask (and, in CSA layers, the indexer's
    top-k mask) - the same index sets as the reference's per-query lists;
  * the indexer's Hadamard rotation is left out: it is orthogonal, so q.k is unchanged; it
    only matters for the FP4 simulation of inference.

Indexer training (the top-k choice is not differentiable): the indexer gets its own loss, a
KL divergence from the main attention's distribution over the completed compressed rows
(softmax of the heads' scores, averaged over heads, detached) to the softmax of its index
scores; its inputs are detached, so that loss trains only the indexer and the main loss
never reaches it (DeepSeek-V3.2's recipe). While `dense_csa` is on (the warm-up phase),
CSA layers attend to every completed row, like HCA; after it, to the indexer's top-k only,
as at inference.

Quantisation-aware training (`QAT.on`): every FP8/FP4 projection sees its weight rounded
as the exporter will store it (quant.py) and its input rounded as the reference's
act_quant does, with straight-through gradients; the cached KV nope dims get the e4m3
simulation of the current revision.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import quant


class QATState:
    on = False


QAT = QATState()


class Cfg:
    """The HF config.json fields the model needs, under the demo's names."""

    def __init__(self, d):
        self.raw = d
        self.vocab = d["vocab_size"]
        self.dim = d["hidden_size"]
        self.n_layers = d["num_hidden_layers"]
        self.n_heads = d["num_attention_heads"]
        self.head_dim = d["head_dim"]
        self.rope_dim = d["qk_rope_head_dim"]
        self.q_lora = d["q_lora_rank"]
        self.o_lora = d["o_lora_rank"]
        self.o_groups = d["o_groups"]
        self.window = d["sliding_window"]
        self.ratios = d["compress_ratios"]
        self.rope_theta = float(d["rope_theta"])
        self.comp_theta = float(d["compress_rope_theta"])
        rs = d["rope_scaling"]
        self.rope_factor = float(rs["factor"])
        self.orig_len = int(rs["original_max_position_embeddings"])
        self.beta_fast, self.beta_slow = float(rs["beta_fast"]), float(rs["beta_slow"])
        self.idx_heads = d["index_n_heads"]
        self.idx_dim = d["index_head_dim"]
        self.idx_topk = d["index_topk"]
        self.n_exp = d["n_routed_experts"]
        self.n_used = d["num_experts_per_tok"]
        self.inter = d["moe_intermediate_size"]
        self.n_hash = d["num_hash_layers"]
        self.route_scale = float(d["routed_scaling_factor"])
        self.limit = float(d["swiglu_limit"])
        self.hc = d["hc_mult"]
        self.sinkhorn_iters = d["hc_sinkhorn_iters"]
        self.hc_eps = float(d["hc_eps"])
        self.eps = float(d["rms_norm_eps"])
        self.n_mtp = d["num_nextn_predict_layers"]


# ============================================================================ small pieces


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def rope_freqs(rd, base, orig_len, factor, beta_fast, beta_slow):
    """Per-pair frequencies, as tools/ref/model.py rope_freqs (YaRN when orig_len > 0)."""
    i = torch.arange(0, rd, 2, dtype=torch.float64)
    freqs = (1.0 / torch.tensor(base, dtype=torch.float64) ** (i / rd)).float()
    if orig_len > 0:
        def corr(n_rot):
            return rd * math.log(orig_len / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), rd - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(rd // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


def rope(x, cos, sin):
    """Interleaved rotation of x [..., rd] (pairs 2i, 2i+1); cos/sin broadcast to [..., rd/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)


def with_rope(x, cos, sin, rd):
    return torch.cat((x[..., :-rd], rope(x[..., -rd:], cos, sin)), -1)


class Linear(nn.Module):
    """y = x W^T; kind None (BF16 in the release), "fp8" (128x128 blocks) or "fp4" (per 32)."""

    def __init__(self, n_in, n_out, std, kind=None):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * std)

    def forward(self, x):
        w = self.weight
        if QAT.on and self.kind is not None:
            w = quant.ste(w, (quant.fp8_blocks if self.kind == "fp8" else quant.fp4_rows)(w.detach())[0])
            x = quant.ste(x, quant.act_e4m3(x.detach()))
        return x @ w.t()


def norm_param(n):
    return nn.Parameter(torch.ones(n))


# ============================================================================ hyper-connections


class HC(nn.Module):
    """One mHC site: fn [(2+hc)*hc, hc*d], base [(2+hc)*hc], scale [3] (pre, post, comb)."""

    def __init__(self, cfg):
        super().__init__()
        hc, d = cfg.hc, cfg.dim
        self.fn = nn.Parameter(torch.randn((2 + hc) * hc, hc * d) / math.sqrt(hc * d))
        base = torch.zeros((2 + hc) * hc)
        base[2 * hc:] = (2.0 * torch.eye(hc)).flatten()
        self.base = nn.Parameter(base)
        self.scale = nn.Parameter(torch.full((3,), 0.1))


def hc_mix(X, fn, eps):
    """Mix logits [N, n_out] of X [N, hc, d] (the rms over all hc*d values scales them)."""
    xf = X.flatten(-2)
    r = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)
    return (xf @ fn.t()) * r


# The 4x4 per-token matrices are kept as [hc, hc, N] (tokens innermost): reductions over a
# dim of 4 at the end of a tensor are very slow on CPU, over a leading dim they are not.


def hc_pre(X, fn, scale, base, cfg):
    """X [N,hc,d] -> u [N,d], post [hc,N], comb [hc(j, source), hc(k, destination), N]."""
    hc, eps = cfg.hc, cfg.hc_eps
    m = hc_mix(X, fn, cfg.eps).t()                                      # [24, N]
    pre = torch.sigmoid(m[:hc] * scale[0] + base[:hc, None]) + eps
    post = 2 * torch.sigmoid(m[hc:2 * hc] * scale[1] + base[hc:2 * hc, None])
    c = (m[2 * hc:] * scale[2] + base[2 * hc:, None]).view(hc, hc, -1)
    c = torch.exp(c - c.max(1, keepdim=True).values)
    c = c / c.sum(1, keepdim=True) + eps
    c = c / (c.sum(0, keepdim=True) + eps)
    for _ in range(cfg.sinkhorn_iters - 1):
        c = c / (c.sum(1, keepdim=True) + eps)
        c = c / (c.sum(0, keepdim=True) + eps)
    u = torch.bmm(pre.t().unsqueeze(1), X).squeeze(1)
    return u, post, c


def hc_post(f, X, post, comb):
    """X_new[k] = post[k] f + sum_j comb[j][k] X[j], as one batched [hc, 1+hc] x [1+hc, d]."""
    A = torch.cat((post.t().unsqueeze(-1), comb.permute(2, 1, 0)), -1)     # [N, k, 1 + j]
    return torch.bmm(A, torch.cat((f.unsqueeze(1), X), 1))


def hc_head(X, fn, scale, base, cfg):
    w = (torch.sigmoid(hc_mix(X, fn, cfg.eps) * scale[0] + base) + cfg.hc_eps).t()   # [hc, N]
    return sum(w[j, :, None] * X[:, j] for j in range(X.shape[1]))


# ============================================================================ attention


class Compressor(nn.Module):
    """Gated softmax pooling of `ratio` tokens (overlapping two blocks when ratio == 4) into
    one row of width dc; rmsnorm, RoPE of the last rd dims at the block's first position."""

    def __init__(self, cfg, ratio, dc):
        super().__init__()
        self.ratio, self.dc = ratio, dc
        coff = 2 if ratio == 4 else 1
        self.ape = nn.Parameter(torch.zeros(ratio, coff * dc))
        self.wkv = Linear(cfg.dim, coff * dc, cfg.dim ** -0.5)
        self.wgate = Linear(cfg.dim, coff * dc, cfg.dim ** -0.5)
        self.norm = nn.Module()
        self.norm.weight = norm_param(dc)

    def forward(self, u, rope_cs, cfg):
        B, T, _ = u.shape
        r, dc = self.ratio, self.dc
        nb = T // r
        a = self.wkv(u[:, :nb * r]).view(B, nb, r, -1)
        g = (self.wgate(u[:, :nb * r]).view(B, nb, r, -1) + self.ape)
        if r == 4:
            pa = F.pad(a[:, :-1, :, :dc], (0, 0, 0, 0, 1, 0))
            pg = F.pad(g[:, :-1, :, :dc], (0, 0, 0, 0, 1, 0), value=float("-inf"))
            a = torch.cat((pa, a[..., dc:]), 2)
            g = torch.cat((pg, g[..., dc:]), 2)
        pooled = (torch.softmax(g, 2) * a).sum(2)                       # [B, nb, dc]
        rows = rmsnorm(pooled, self.norm.weight, cfg.eps)
        cos, sin = rope_cs
        return with_rope(rows, cos[:nb * r:r], sin[:nb * r:r], cfg.rope_dim)


class Indexer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wq_b = Linear(cfg.q_lora, cfg.idx_heads * cfg.idx_dim, cfg.q_lora ** -0.5, "fp8")
        self.weights_proj = Linear(cfg.dim, cfg.idx_heads, cfg.dim ** -0.5)
        self.compressor = Compressor(cfg, 4, cfg.idx_dim)

    def forward(self, u, qr, rope_cs, cfg):
        """Index scores [B, T, n_blocks] (not masked)."""
        B, T, _ = u.shape
        q = self.wq_b(qr).view(B, T, cfg.idx_heads, cfg.idx_dim)
        cos, sin = rope_cs
        q = with_rope(q, cos[:T, None], sin[:T, None], cfg.rope_dim)
        k = self.compressor(u, rope_cs, cfg)                             # [B, nb, dI]
        w = self.weights_proj(u) * (cfg.idx_dim ** -0.5 * cfg.idx_heads ** -0.5)
        s = torch.relu(torch.einsum("bthd,bjd->bthj", q, k))
        return torch.einsum("bthj,bth->btj", s, w)


class Attention(nn.Module):
    def __init__(self, cfg, ratio):
        super().__init__()
        self.ratio = ratio
        d, H, D = cfg.dim, cfg.n_heads, cfg.head_dim
        self.attn_sink = nn.Parameter(torch.zeros(H))
        self.wq_a = Linear(d, cfg.q_lora, d ** -0.5, "fp8")
        self.q_norm = nn.Module()
        self.q_norm.weight = norm_param(cfg.q_lora)
        self.wq_b = Linear(cfg.q_lora, H * D, cfg.q_lora ** -0.5, "fp8")
        self.wkv = Linear(d, D, d ** -0.5, "fp8")
        self.kv_norm = nn.Module()
        self.kv_norm.weight = norm_param(D)
        gin = H * D // cfg.o_groups
        self.wo_a = Linear(gin, cfg.o_groups * cfg.o_lora, gin ** -0.5, "fp8")
        self.wo_b = Linear(cfg.o_groups * cfg.o_lora, d, (cfg.o_groups * cfg.o_lora) ** -0.5 / math.sqrt(2 * (cfg.n_layers + 1)), "fp8")
        if ratio:
            self.compressor = Compressor(cfg, ratio, D)
        if ratio == 4:
            self.indexer = Indexer(cfg)

    def forward(self, u, ctx):
        cfg = ctx.cfg
        B, T, _ = u.shape
        H, D, rd = cfg.n_heads, cfg.head_dim, cfg.rope_dim
        N = D - rd
        rope_cs = ctx.rope_comp if self.ratio else ctx.rope_swa
        cos, sin = rope_cs
        qr = rmsnorm(self.wq_a(u), self.q_norm.weight, cfg.eps)
        q = self.wq_b(qr).view(B, T, H, D)
        q = q * torch.rsqrt((q * q).mean(-1, keepdim=True) + cfg.eps)
        q = with_rope(q, cos[:T, None], sin[:T, None], rd)
        kv = rmsnorm(self.wkv(u), self.kv_norm.weight, cfg.eps)
        kv = with_rope(kv, cos[:T], sin[:T], rd)
        if QAT.on:
            kv = torch.cat((quant.ste(kv[..., :N], quant.act_e4m3(kv[..., :N].detach(), 64)), kv[..., N:]), -1)
        scale = D ** -0.5
        parts = [torch.einsum("bthd,bsd->bhts", q, kv) * scale + ctx.window_bias(T)]
        values = [kv]
        if self.ratio:
            comp = self.compressor(u, rope_cs, cfg)                     # [B, nb, D]
            if QAT.on:
                comp = torch.cat((quant.ste(comp[..., :N], quant.act_e4m3(comp[..., :N].detach(), 64)),
                                  comp[..., N:]), -1)
            sc = torch.einsum("bthd,bjd->bhtj", q, comp) * scale
            valid = ctx.block_valid(T, self.ratio)                       # [T, nb] bool
            if self.ratio == 4:
                idx = self.indexer(u.detach(), qr.detach(), rope_cs, cfg)  # [B, T, nb]
                idx = idx.masked_fill(~valid, float("-inf"))
                self.index_loss(idx, sc.detach(), valid, ctx)
                if not ctx.dense_csa:
                    k = min(cfg.idx_topk, valid.shape[1])
                    top = idx.topk(k, -1).indices
                    sel = torch.zeros_like(idx, dtype=torch.bool).scatter_(-1, top, True) & valid
                    sc = sc.masked_fill(~sel[:, None], float("-inf"))
            sc = sc.masked_fill(~valid, float("-inf"))
            parts.append(sc)
            values.append(comp)
        parts.append(self.attn_sink.view(1, H, 1, 1).expand(B, H, T, 1))
        p = torch.softmax(torch.cat(parts, -1), -1)
        o = torch.einsum("bhts,bsd->bthd", p[..., :T], kv)
        if self.ratio:
            o = o + torch.einsum("bhtj,bjd->bthd", p[..., T:-1], values[1])
        o = with_rope(o, cos[:T, None], -sin[:T, None], rd)
        G = cfg.o_groups
        wa = self.wo_a.weight
        if QAT.on:
            wa = quant.ste(wa, quant.fp8_blocks(wa.detach())[0])
        z = torch.einsum("btgi,gri->btgr", o.reshape(B, T, G, -1), wa.view(G, cfg.o_lora, -1))
        return self.wo_b(z.flatten(-2))

    @staticmethod
    def index_loss(idx, sc, valid, ctx):
        """KL(main attention over completed rows, head-averaged || softmax(index scores))."""
        has = valid.any(-1)                                              # [T]
        if not bool(has.any()):
            return
        tgt = torch.softmax(sc.masked_fill(~valid, float("-inf"))[:, :, has], -1).mean(1)   # [B, T', nb]
        logq = torch.log_softmax(idx[:, has], -1)
        kl = (tgt * (torch.log(tgt.clamp(min=1e-12)) - logq.clamp(min=-1e4))).sum(-1).mean()
        ctx.index_losses.append(kl)


# ============================================================================ MoE


class Expert(nn.Module):
    def __init__(self, cfg, kind, out_scale):
        super().__init__()
        d, f = cfg.dim, cfg.inter
        self.w1 = Linear(d, f, d ** -0.5, kind)
        self.w3 = Linear(d, f, d ** -0.5, kind)
        self.w2 = Linear(f, d, f ** -0.5 * out_scale, kind)

    def forward(self, x, limit, weight=None):
        g, v = self.w1(x), self.w3(x)
        if limit > 0:
            v = torch.clamp(v, -limit, limit)
            g = torch.clamp(g, max=limit)
        h = F.silu(g) * v
        if weight is not None:
            h = h * weight.unsqueeze(-1)
        return self.w2(h)


class Gate(nn.Module):
    def __init__(self, cfg, hashed):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cfg.n_exp, cfg.dim) * cfg.dim ** -0.5)
        if hashed:
            self.register_buffer("tid2eid", torch.zeros(cfg.vocab, cfg.n_used, dtype=torch.int64))
        else:
            self.register_buffer("bias", torch.zeros(cfg.n_exp))


class MoE(nn.Module):
    def __init__(self, cfg, hashed):
        super().__init__()
        self.hashed = hashed
        out_scale = 1 / math.sqrt(2 * (cfg.n_layers + 1))
        self.gate = Gate(cfg, hashed)
        self.experts = nn.ModuleList(Expert(cfg, "fp4", out_scale) for _ in range(cfg.n_exp))
        self.shared_experts = Expert(cfg, "fp8", out_scale)
        self.load = None

    def forward(self, u, ids, ctx):
        cfg = ctx.cfg
        x = u
        score = torch.sqrt(F.softplus(x @ self.gate.weight.t()))
        if self.hashed:
            eids = self.gate.tid2eid[ids.reshape(-1)]
        else:
            eids = (score.detach() + self.gate.bias).topk(cfg.n_used, -1).indices
            self.load = torch.bincount(eids.flatten(), minlength=cfg.n_exp)
        w = score.gather(1, eids)
        w = w / w.sum(-1, keepdim=True) * cfg.route_scale
        y = torch.zeros_like(x)
        for e in range(cfg.n_exp):
            tok, slot = torch.nonzero(eids == e, as_tuple=True)
            if tok.numel():
                y = y.index_add(0, tok, self.experts[e](x[tok], cfg.limit, w[tok, slot]))
        return y + self.shared_experts(x, cfg.limit)


# ============================================================================ blocks


class Block(nn.Module):
    def __init__(self, cfg, layer_id):
        super().__init__()
        ratio = cfg.ratios[layer_id]
        self.attn_norm = nn.Module()
        self.attn_norm.weight = norm_param(cfg.dim)
        self.ffn_norm = nn.Module()
        self.ffn_norm.weight = norm_param(cfg.dim)
        ha, hf = HC(cfg), HC(cfg)
        self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale = ha.fn, ha.base, ha.scale
        self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale = hf.fn, hf.base, hf.scale
        self.attn = Attention(cfg, ratio)
        self.ffn = MoE(cfg, hashed=layer_id < cfg.n_hash)

    def forward(self, X, ids, ctx):
        """X [B*T, hc, d] -> the same after the attention and FFN sublayers."""
        cfg, B, T = ctx.cfg, ctx.B, ctx.T
        u, post, comb = hc_pre(X, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base, cfg)
        f = self.attn(rmsnorm(u, self.attn_norm.weight, cfg.eps).view(B, T, -1), ctx)
        X = hc_post(f.reshape(B * T, -1), X, post, comb)
        u, post, comb = hc_pre(X, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base, cfg)
        f = self.ffn(rmsnorm(u, self.ffn_norm.weight, cfg.eps), ids, ctx)
        return hc_post(f, X, post, comb)


class MTPBlock(Block):
    def __init__(self, cfg):
        super().__init__(cfg, cfg.n_layers)
        d = cfg.dim
        self.e_proj = Linear(d, d, d ** -0.5, "fp8")
        self.h_proj = Linear(d, d, d ** -0.5, "fp8")
        for n in ("enorm", "hnorm", "norm"):
            m = nn.Module()
            m.weight = norm_param(d)
            setattr(self, n, m)
        h = HC(cfg)
        self.hc_head_fn = nn.Parameter(h.fn.data[:cfg.hc].clone())
        self.hc_head_base = nn.Parameter(torch.zeros(cfg.hc))
        self.hc_head_scale = nn.Parameter(torch.full((1,), 0.1))


class Ctx:
    """Per-forward constants: config, RoPE tables, masks, training switches, collected losses."""

    def __init__(self, cfg, B, T, dense_csa):
        self.cfg, self.B, self.T = cfg, B, T
        self.dense_csa = dense_csa
        self.index_losses = []
        pos = torch.arange(T, dtype=torch.float32)
        for name, base, orig in (("rope_swa", cfg.rope_theta, 0), ("rope_comp", cfg.comp_theta, cfg.orig_len)):
            fr = rope_freqs(cfg.rope_dim, base, orig, cfg.rope_factor, cfg.beta_fast, cfg.beta_slow)
            ang = pos[:, None] * fr[None, :]
            setattr(self, name, (torch.cos(ang), torch.sin(ang)))
        self._masks = {}

    def window_bias(self, T):
        key = ("win", T)
        if key not in self._masks:
            t = torch.arange(T)
            ok = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - self.cfg.window)
            self._masks[key] = torch.zeros(T, T).masked_fill(~ok, float("-inf"))
        return self._masks[key]

    def block_valid(self, T, ratio):
        key = ("blk", T, ratio)
        if key not in self._masks:
            t = torch.arange(T)
            j = torch.arange(T // ratio)
            self._masks[key] = (j[None, :] + 1) * ratio <= t[:, None] + 1
        return self._masks[key]


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.embed = nn.Embedding(cfg.vocab, d)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = nn.Module()
        self.norm.weight = norm_param(d)
        self.head = Linear(d, cfg.vocab, d ** -0.5)
        h = HC(cfg)
        self.hc_head_fn = nn.Parameter(h.fn.data[:cfg.hc].clone())
        self.hc_head_base = nn.Parameter(torch.zeros(cfg.hc))
        self.hc_head_scale = nn.Parameter(torch.full((1,), 0.1))
        self.mtp = nn.ModuleList(MTPBlock(cfg) for _ in range(cfg.n_mtp))

    def init_hash(self, gen):
        """Hash routing tables: each token gets n_used distinct experts, drawn with `gen`."""
        cfg = self.cfg
        for layer in self.layers:
            if layer.ffn.hashed:
                r = torch.rand(cfg.vocab, cfg.n_exp, generator=gen)
                layer.ffn.gate.tid2eid.copy_(r.argsort(-1)[:, :cfg.n_used])

    def forward(self, ids, dense_csa=False, mtp=True):
        """ids [B, T] -> (logits [B, T, V], mtp_logits [B, T-1, V] or None, index losses).
        mtp_logits[:, t] predicts ids[:, t + 2] from the main streams at t and ids[:, t + 1]."""
        cfg = self.cfg
        B, T = ids.shape
        ctx = Ctx(cfg, B, T, dense_csa)
        N, hc, d = B * T, cfg.hc, cfg.dim
        X = self.embed(ids).reshape(N, 1, d).expand(N, hc, d)
        for layer in self.layers:
            X = layer(X, ids, ctx)
        y = rmsnorm(hc_head(X, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, cfg), self.norm.weight, cfg.eps)
        logits = self.head(y).view(B, T, -1)
        mtp_logits = None
        if mtp and len(self.mtp):
            m = self.mtp[0]
            e = rmsnorm(self.embed(ids[:, 1:]), m.enorm.weight, cfg.eps).reshape(B * (T - 1), 1, d)
            hh = rmsnorm(X.view(B, T, hc, d)[:, :-1], m.hnorm.weight, cfg.eps).reshape(B * (T - 1), hc, d)
            Xm = m.h_proj(hh) + m.e_proj(e)
            mctx = Ctx(cfg, B, T - 1, dense_csa)
            Xm = m(Xm, ids[:, 1:], mctx)
            ym = rmsnorm(hc_head(Xm, m.hc_head_fn, m.hc_head_scale, m.hc_head_base, cfg), m.norm.weight, cfg.eps)
            mtp_logits = self.head(ym).view(B, T - 1, -1)
        return logits, mtp_logits, ctx.index_losses

    def routed_layers(self):
        return [l.ffn for l in list(self.layers) + list(self.mtp) if not l.ffn.hashed]
