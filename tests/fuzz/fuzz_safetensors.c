/*
 * fuzz_safetensors.c - libFuzzer entry point for the safetensors header parser.
 * Build with `make fuzz` (clang), run: build-fuzz/fuzz_safetensors tests/fuzz/corpus/safetensors
 * New crashers go into the corpus directory; `make test` replays it.
 */
#include <stddef.h>
#include <stdint.h>

#include "io/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dsv4_arena   a;
    struct dsv4_tensor *ts;
    size_t              n;
    struct dsv4_err     err;
    dsv4_arena_init(&a, 4096);
    dsv4_st_parse(data, size, "fuzz", &a, &ts, &n, &err);
    dsv4_arena_free(&a);
    return 0;
}
