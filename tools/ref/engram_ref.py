"""engram_ref.py - reference of the DeepSeek-V4.1 Engram row indices (docs/ENGRAM.md).

Owns: the hash multipliers (the official inference/engram.py `compute_hash_multipliers`,
drawn with numpy's own Generator), the prime tables (`EngramLayout.from_args`, primes from sympy
as the official code takes them), the per-position row indices (`NgramHashState.forward`),
and the fixture tests/fixtures/engram/engram_hash.json that tests/unit/test_engram_hash.c
compares src/model/engram_hash.c against.

Why numpy and sympy: the C side re-implements numpy's PCG64, SeedSequence and bounded-integer
draw and a primality test; this file uses the real libraries, so a fixture mismatch means the C
side is wrong, not that two re-implementations agree. Indices are computed the way
engram.py computes them (a cache of compressed ids over the whole sequence, gathered per
look-back shift), not the way the C side does (a rolling history), for the same reason.

Run with Debian's /usr/bin/python3 (python3-numpy, python3-sympy):
    /usr/bin/python3 tools/ref/engram_ref.py [--out tests/fixtures/engram/engram_hash.json]
"""

import argparse
import json
import os

import numpy as np
import sympy

DEAD = -1  # engram.py NgramHashState.DEAD: a token that takes part in no n-gram

# The Engram fields of DeepSeek-V4.1-Flash's config.json (text_config.engram_*), as released.
# The check below that each layer's table holds exactly the sum of its primes ties them to the
# prime layout: a wrong prime rule would not reproduce these row counts.
V41_FLASH = dict(
    name="v41_flash",
    layer_ids=[1, 14],
    num_embeddings=[384006168, 384016682],
    max_ngram_size=4,
    vocab_size=16000000,
    n_heads=8,
    compressed_vocab_size=99092,
)

# Test-sized sets: layer 0 (seed 0), three n-gram orders; the second is the shape of a tiny
# V4.1 test config seen in public ports (vocab 16, 2 heads, 156 rows).
TINY_A = dict(name="tiny_a", layer_ids=[0, 3, 7], max_ngram_size=3, vocab_size=10, n_heads=3,
              compressed_vocab_size=50)
TINY_B = dict(name="tiny_b", layer_ids=[1], num_embeddings=[156], max_ngram_size=4,
              vocab_size=16, n_heads=2, compressed_vocab_size=242)


def multipliers(layer_ids, max_ngram_size, compressed_vocab_size):
    """compute_hash_multipliers: per layer, default_rng(10007 * layer).integers(0, bound) with
    bound = (int64 max // compressed vocab) // 2, made odd (2v + 1). Python ints throughout."""
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab_size) // 2)
    rows = []
    for layer in layer_ids:
        g = np.random.default_rng(10007 * layer)
        v = g.integers(low=0, high=bound, size=(max_ngram_size,), dtype=np.int64)
        rows.append([int(x) * 2 + 1 for x in v])
    return rows


def primes(n_layers, max_ngram_size, n_heads, vocab_size):
    """EngramLayout.from_args: for each (layer, n-gram order) the search restarts above
    vocab_size - 1 and takes the next n_heads primes not taken by any earlier slot."""
    seen, out = set(), []
    for _ in range(n_layers):
        layer = []
        for _ in range(max_ngram_size - 1):
            cur = vocab_size - 1
            for _ in range(n_heads):
                cur = sympy.nextprime(cur)
                while cur in seen:
                    cur = sympy.nextprime(cur)
                seen.add(cur)
                layer.append(cur)
        out.append(layer)
    return out


def offsets(prime_rows):
    """Each (order, head) column starts where the previous one's bucket range ends."""
    return [[int(x) for x in np.cumsum([0] + row[:-1])] for row in prime_rows]


def indices(ids, pad, mult, prime_rows, offs, max_ngram_size, n_heads):
    """NgramHashState.forward on one whole sequence from position 0. ids: compressed ids or
    DEAD. Returns [T][layer][(order) * n_heads + head] row ids."""
    T = len(ids)
    cache = np.array(ids, dtype=np.int64)
    pos = np.arange(T)
    blocked = np.zeros(T, dtype=bool)
    tokens = []
    for shift in range(max_ngram_size):
        src = cache[np.maximum(pos - shift, 0)]
        blocked = blocked | (pos < shift) | (src == DEAD)
        tokens.append(np.where(blocked, pad, src))
    tokens = np.stack(tokens, axis=-1)                                  # [T, n]
    m = np.array(mult, dtype=np.int64)                                  # [L, n]
    prod = tokens[:, None, :] * m[None, :, :]                           # [T, L, n], < 2^63
    p = np.array(prime_rows, dtype=np.int64).reshape(len(mult), max_ngram_size - 1, n_heads)
    rolling, cols = prod[..., 0], []
    for i in range(1, max_ngram_size):
        rolling = np.bitwise_xor(rolling, prod[..., i])
        cols.append(rolling[..., None] % p[None, :, i - 1, :])
    out = np.concatenate(cols, axis=-1) + np.array(offs, dtype=np.int64)[None]
    return out.tolist()


def sequences(cv, pad, seed):
    """Sequences that start fresh at position 0: short ones (shorter than the n-gram), pads
    among the ids, DEAD (masked) tokens at the start, middle and end, the largest id."""
    rng = np.random.default_rng(seed)
    rand = [int(x) for x in rng.integers(0, cv, size=40)]
    return [
        [5 % cv],
        [cv - 1, 0],
        rand[:17],
        [pad, pad, 3 % cv, pad, cv - 1, cv - 1, 2 % cv],
        [DEAD, 4 % cv, 7 % cv, DEAD, 1, 2 % cv, 9 % cv, 11 % cv, DEAD],
        rand[17:40],
    ]


def param_set(spec, pad, seed):
    L, n, h = len(spec["layer_ids"]), spec["max_ngram_size"], spec["n_heads"]
    mult = multipliers(spec["layer_ids"], n, spec["compressed_vocab_size"])
    pr = primes(L, n, h, spec["vocab_size"])
    offs = offsets(pr)
    sums = [sum(row) for row in pr]
    if "num_embeddings" in spec:
        assert spec["num_embeddings"] == sums, (spec["name"], spec["num_embeddings"], sums)
    seqs = sequences(spec["compressed_vocab_size"], pad, seed)
    d = dict(spec)
    d.update(num_embeddings=spec.get("num_embeddings", sums), pad_compressed=pad,
             multipliers=mult, primes=pr, offsets=offs,
             sequences=[dict(ids=s, indices=indices(s, pad, mult, pr, offs, n, h)) for s in seqs])
    return d


def pcg64_vectors():
    """numpy's own first outputs, so a wrong generator fails before any index is compared."""
    raw = {}
    for seed in (0, 1, 10007, 140098, 2**32 + 5):
        bg = np.random.PCG64(seed)
        raw[str(seed)] = ["%016x" % int(x) for x in bg.random_raw(6)]
    ints = []
    for seed, high in ((0, 2**40), (0, 46542037146911), (10007, 3 * 2**61 + 17), (7, 2**62)):
        g = np.random.default_rng(seed)
        v = g.integers(0, high, size=8, dtype=np.int64)
        ints.append(dict(seed=seed, high=high, values=[int(x) for x in v]))
    return dict(raw=raw, integers=ints)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                   "fixtures", "engram", "engram_hash.json"))
    a = ap.parse_args()
    fixture = dict(
        comment="tools/ref/engram_ref.py (numpy %s, sympy %s); docs/ENGRAM.md" %
                (np.__version__, sympy.__version__),
        dead=DEAD,
        pcg64=pcg64_vectors(),
        sets=[param_set(V41_FLASH, pad=2, seed=41), param_set(TINY_A, pad=1, seed=1),
              param_set(TINY_B, pad=240, seed=2)],
    )
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
