/*
 * main.c - the `dsv4` command: a table of subcommands, each a thin front end over libdsv4.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dsv4.h"

static const struct cli_command commands[] = {
    { "inspect", "check a checkpoint and print its architecture and memory figures", cmd_inspect },
    { "logits",  "teacher-forced logits of a token list, at any chunking (float32 [T, vocab])", cmd_logits },
    { "run",     "generate from a prompt", cmd_run },
    { "chat",    "interactive multi-turn chat in the V4 chat format (line editor; Ctrl-D exits)", cmd_chat },
    { "perplexity", "perplexity over a text; KL divergence against saved base logits", cmd_perplexity },
    { "batch",   "many prompts through the serving scheduler (JSON lines in and out, latency figures)", cmd_batch },
    { "align",   "compare every stage with a reference dump; name the first divergence", cmd_align },
    { "bench",   "prefill and decode speed, bytes per step and share of the memory bandwidth", cmd_bench },
    { "ops",     "which kernel runs each backend op on this machine", cmd_ops },
    { "test-ops", "every backend op against the scalar reference, at each level this machine runs", cmd_test_ops },
    { "convert", "write the dsv4-native checkpoint (page-aligned, one mmap, loads without work)", cmd_convert },
    { "gen",     "write a random-weight checkpoint in the official layout (tests, benchmarks)", cmd_gen },
    { "serve",   "OpenAI-compatible HTTP server: chat, completions, streaming, metrics, health, drain", cmd_serve },
    { "loadtest", "drive a running server with streaming requests; SLO gate on TTFT, ITL and errors", cmd_loadtest },
    { "tokenize",   "encode standard input with a tokenizer.json, one id per line", cmd_tokenize },
    { "detokenize", "decode ids from standard input to the exact bytes", cmd_detokenize },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 COMMAND [options]   (dsv4 COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

static int run_command(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dsv4 %s\n", DSV4_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsv4: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    /* under mpirun (docs/DISTRIBUTED.md): rank 0 runs the command, the others serve experts */
    int rank = dsv4_mpi_start(&argc, &argv);
    int rc   = rank == 0 ? run_command(argc, argv) : dsv4_mpi_serve();
    dsv4_mpi_finish();
    return rc;
}
