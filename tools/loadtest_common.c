/*
 * loadtest_common.c - what the client threads (loadtest_mix.c), the watch and its reports
 * (loadtest_soak.c) and the summary (cmd_loadtest.c) of `dsv4 loadtest` all read: the names
 * of classes, kinds and outcomes, the counts summed over them, and the quarter of the run a
 * time falls in. Kept apart so that neither of the two calls the other.
 */
#include "loadtest_shared.h"

const char *const lt_class_name[LT_N_CLASS] = { "short", "medium", "long" };
const char *const lt_kind_name[LT_N_KIND]   = { "stream", "plain", "disconnect", "bad", "slow" };
const char *const lt_outcome_name[LT_N_OUT] = {
    "done",     "client_cut", "server_cut",  "bad_4xx", "connect", "no_response",
    "http_4xx", "http_5xx",   "http_other", "error_event", "no_done", "bad_body",
};

long lt_count_outcome(const struct lt_shared *sh, enum lt_outcome o)
{
    long n = 0;
    for (int k = 0; k < LT_N_KIND; k++) n += sh->count[k][o];
    return n;
}

long lt_count_kind(const struct lt_shared *sh, enum lt_kind k)
{
    long n = 0;
    for (int o = 0; o < LT_N_OUT; o++) n += sh->count[k][o];
    return n;
}

int lt_quarter(const struct lt_shared *sh, double t)
{
    const struct lt_opts *o = sh->o;
    if (o->requests > 0) return -1;
    return soak_quarter((t - sh->t_start) / o->duration_s);
}
