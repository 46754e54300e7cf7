/* inspect_ranks.h - the per-rank memory plan of `dsv4 inspect --ranks N` (inspect_ranks.c). */
#ifndef DSV4_INSPECT_RANKS_H
#define DSV4_INSPECT_RANKS_H

#include <jansson.h>
#include <stdbool.h>

#include "model/rank_plan.h"

struct rank_report {
    struct dsv4_rank_params p;
    struct dsv4_rank_mem   *mem; /* [p.n_ranks], malloc'd */
    struct dsv4_rank_mem    single;
    bool                    repack_known; /* false without weights (--config) */
    size_t                  n_tensors;
    char                    backend[128]; /* what the scratch was sized for */
};

/* From a checkpoint (its tensors as stored, the repack of the default backend's level). */
int  rank_report_checkpoint(struct rank_report *r, const struct dsv4_config *c, const struct dsv4_checkpoint *ck,
                            struct dsv4_weights *w, struct dsv4_err *err);
/* From the config alone (dsv4_weights_layout). */
int  rank_report_config(struct rank_report *r, const struct dsv4_config *c, struct dsv4_err *err);
void rank_report_free(struct rank_report *r);
void rank_report_print(const struct rank_report *r);
json_t *rank_report_json(const struct rank_report *r);

#endif
