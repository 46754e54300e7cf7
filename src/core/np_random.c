/*
 * np_random.c - numpy's SeedSequence, PCG64 and int64 Generator.integers (np_random.h).
 *
 * Written from numpy's documented algorithms: SeedSequence mixes the seed's 32-bit words into a
 * pool of 4 words with the hashmix/mix functions of M. O'Neill's seed_seq design and expands
 * the pool with a second hash; PCG64 is the 128-bit LCG with the XSL-RR output, stepped
 * before each output; bounded integers use Lemire's multiply-and-reject with numpy's
 * threshold. tests/unit/test_engram_hash.c checks the outputs against numpy's own
 * (tests/fixtures/engram/engram_hash.json, written by tools/ref/engram_ref.py).
 */
#include "core/np_random.h"

#include "dsv4.h"

enum {
    SS_POOL = 4, /* SeedSequence's default pool_size */
};

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L  0xca01f9ddu
#define SS_MIX_R  0x4973f715u

static uint32_t ss_hashmix(uint32_t v, uint32_t *hc)
{
    v ^= *hc;
    *hc *= SS_MULT_A;
    v *= *hc;
    return v ^ (v >> 16);
}

static uint32_t ss_mix(uint32_t x, uint32_t y)
{
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> 16);
}

/* SeedSequence(seed).generate_state(4, np.uint64). The seed's words are little-endian 32-bit
 * pieces, at least one (seed 0 is [0]). */
static void ss_state(uint64_t seed, uint64_t out[4])
{
    uint32_t words[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    int      n_words = (seed >> 32) ? 2 : 1;
    uint32_t pool[SS_POOL], hc = SS_INIT_A;

    for (int i = 0; i < SS_POOL; i++) pool[i] = ss_hashmix(i < n_words ? words[i] : 0, &hc);
    for (int s = 0; s < SS_POOL; s++)
        for (int d = 0; d < SS_POOL; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &hc));
    /* every seed word already went into the pool (at most 2 < SS_POOL) */

    uint32_t hb = SS_INIT_B, w[8];
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % SS_POOL] ^ hb;
        hb *= SS_MULT_B;
        v *= hb;
        w[i] = v ^ (v >> 16);
    }
    for (int i = 0; i < 4; i++) out[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
}

static dsv4_u128 u128_of(uint64_t hi, uint64_t lo)
{
    return ((dsv4_u128)hi << 64) | lo;
}

static void pcg64_step(struct dsv4_pcg64 *g)
{
    const dsv4_u128 mult = u128_of(0x2360ed051fc65da4ull, 0x4385df649fccf645ull);
    g->state = g->state * mult + g->inc;
}

void dsv4_pcg64_seed(struct dsv4_pcg64 *g, uint64_t seed)
{
    uint64_t v[4];
    ss_state(seed, v);
    /* numpy's pcg64_set_seed: words 0-1 the initial state, 2-3 the stream (high word first) */
    g->state = 0;
    g->inc   = (u128_of(v[2], v[3]) << 1) | 1u;
    pcg64_step(g);
    g->state += u128_of(v[0], v[1]);
    pcg64_step(g);
}

uint64_t dsv4_pcg64_next(struct dsv4_pcg64 *g)
{
    pcg64_step(g);
    uint64_t x   = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    unsigned rot = (unsigned)(g->state >> 122);
    return (x >> rot) | (x << ((64u - rot) & 63u));
}

/* A uniform draw in [0, rng] for rng in (2^32 - 1, 2^64 - 1): Lemire's method as numpy's
 * bounded_lemire_uint64 does it (the rejection threshold computed only when it can matter). */
static uint64_t lemire64(struct dsv4_pcg64 *g, uint64_t rng)
{
    const uint64_t excl = rng + 1;
    dsv4_u128      m    = (dsv4_u128)dsv4_pcg64_next(g) * excl;
    uint64_t       left = (uint64_t)m;
    if (left < excl) {
        const uint64_t threshold = (UINT64_MAX - rng) % excl;
        while (left < threshold) {
            m    = (dsv4_u128)dsv4_pcg64_next(g) * excl;
            left = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

int dsv4_pcg64_integers(struct dsv4_pcg64 *g, int64_t low, int64_t high, int64_t *out, int n)
{
    if (low >= high) return DSV4_EINVAL;
    uint64_t rng = (uint64_t)high - (uint64_t)low - 1u;
    if (rng != 0 && rng <= 0xffffffffu) return DSV4_EUNSUPPORTED;
    for (int i = 0; i < n; i++) {
        uint64_t d;
        if (rng == 0) d = 0; /* numpy draws nothing here */
        else if (rng == UINT64_MAX) d = dsv4_pcg64_next(g);
        else d = lemire64(g, rng);
        out[i] = (int64_t)((uint64_t)low + d);
    }
    return 0;
}
