/*
 * np_random.h - numpy's default random generator, reproduced bit for bit: SeedSequence
 * seeding, the PCG64 bit generator (XSL-RR output of a 128-bit LCG) and Generator.integers
 * for int64. The Engram hash multipliers of DeepSeek-V4.1 are drawn with
 * np.random.default_rng(seed).integers(...) (docs/ENGRAM.md), so an engine that hashes like
 * the release must draw exactly what numpy draws. Integer arithmetic only (64/128-bit):
 * the values reach 2^62, past what a double holds exactly.
 */
#ifndef DSV4_NP_RANDOM_H
#define DSV4_NP_RANDOM_H

#include <stdint.h>

__extension__ typedef unsigned __int128 dsv4_u128;

struct dsv4_pcg64 {
    dsv4_u128 state;
    dsv4_u128 inc; /* odd: the stream */
};

/* np.random.PCG64(seed), which default_rng(seed) wraps: SeedSequence(seed) with a pool of 4
 * words, generate_state(4, uint64) into the initial state and stream. */
void     dsv4_pcg64_seed(struct dsv4_pcg64 *g, uint64_t seed);
/* The next 64-bit output (PCG64.random_raw). */
uint64_t dsv4_pcg64_next(struct dsv4_pcg64 *g);
/* Generator.integers(low, high, size=n, dtype=np.int64), high exclusive, low < high. Returns 0,
 * or DSV4_EUNSUPPORTED (drawing nothing) when high - low - 1 fits 32 bits and is not 0, where
 * numpy takes its 32-bit path, which this file does not reproduce. */
int dsv4_pcg64_integers(struct dsv4_pcg64 *g, int64_t low, int64_t high, int64_t *out, int n);

#endif /* DSV4_NP_RANDOM_H */
