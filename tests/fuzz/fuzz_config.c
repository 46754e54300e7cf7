/*
 * fuzz_config.c - libFuzzer harness for the config.json parser and validator,
 * dsv4_config_parse (src/model/config.c).
 *
 * The input is a whole config.json document. A document that passes is checked for the
 * promises the rest of the engine relies on without re-checking (the shape rules of the
 * file header of config.c: head split, o_groups, compress ratios, layer counts); one that
 * breaks them aborts, as a crash would. Otherwise outputs are not checked.
 *
 * Build: make fuzz (clang) -> build-fuzz/fuzz_config. Run from the repository root:
 *   mkdir -p build-fuzz/corpus-config
 *   build-fuzz/fuzz_config -max_len=4096 -timeout=10 -dict=tests/fuzz/config.dict \
 *       build-fuzz/corpus-config tests/fuzz/corpus/config
 * New inputs go to the first directory; keep those that add coverage with
 *   build-fuzz/fuzz_config -merge=1 -use_counters=0 tests/fuzz/corpus/config build-fuzz/corpus-config
 * and a crasher, once fixed, as tests/fuzz/corpus/config/crash-<what>.
 * `make test` replays tests/fuzz/corpus/config without libFuzzer (tests/fuzz/replay_main.c).
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dsv4_config c;
    struct dsv4_err    err;
    if (dsv4_config_parse(&c, (const char *)data, size, "config.json", &err) != DSV4_OK) return 0;
    bool ok = c.n_layer >= 1 && c.n_layer + c.n_mtp <= DSV4_MAX_LAYERS && c.d_rope < c.d_head &&
              c.d_nope == c.d_head - c.d_rope && c.d_nope % 64 == 0 && c.o_groups >= 1 &&
              c.n_head % c.o_groups == 0 && c.n_exp_used <= c.n_exp && c.n_hash_layer <= c.n_layer &&
              c.bos_id < c.vocab_size && c.eos_id < c.vocab_size && c.hc >= 1 && c.hc <= DSV4_MAX_HC;
    for (int i = 0; ok && i < c.n_layer + c.n_mtp; i++)
        ok = c.ratio[i] == 0 || (c.ratio[i] >= 4 && c.ratio[i] <= 256 && (c.ratio[i] & (c.ratio[i] - 1)) == 0);
    if (!ok) abort();
    return 0;
}
