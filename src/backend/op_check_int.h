/*
 * op_check_int.h - between the op checker's engine (op_check.c) and its case tables
 * (op_check_*.c). A case builds its inputs once, then runs the op once per context the
 * engine hands out: the reference first, then each level (and weight layout) of the backend
 * checked; the outputs of every run are compared with the reference's when the next begins:
 *
 *     chk_case(h, "tiny-a wq_b", &dims);
 *     float *x = chk_alloc(h, ...);                  (inputs, freed with the case)
 *     for (struct dsv4_backend *be; (be = chk_next(h));) {
 *         float *y = chk_out_f32(h, 0, n, tol, NULL, NULL);
 *         be->ops->linear(be, &w, n, chk_in(h, x), ...);
 *     }
 *
 * What the op reads or writes in backend memory (activations, stored rows, scratch, the MoE
 * tables, the tables of each_tensor) goes to it through chk_in, chk_work and the output
 * slots; host metadata the contract leaves on the host (positions, token ids, page tables)
 * is passed as it is.
 */
#ifndef DSV4_OP_CHECK_INT_H
#define DSV4_OP_CHECK_INT_H

#include "backend/op_check.h"

struct chk;

/* How far an output may be from the reference's: |got - ref| <= rel |ref| + abs + mag m[i]
 * (m: a per-value magnitude the case passes, e.g. sum |w x| of a dot product), for all but
 * bad_per_mille of the values. All zero: bit-identical. */
struct chk_tol {
    double rel, abs, mag;
    int    bad_per_mille;
};
#define CHK_EXACT ((struct chk_tol){ 0, 0, 0, 0 })

/* An op's cases: runs every case (chk_case .. chk_next returning NULL) for h->op. */
struct chk_op {
    enum dsv4_op op;
    const char  *tol; /* the tolerance in words, for the report */
    void (*run)(struct chk *h);
};
extern const struct chk_op chk_ops_rows[], chk_ops_kv[], chk_ops_moe[]; /* each ends with run NULL */

/* Starts a case: its name (printf format) and the plan widths its scratch is sized by. */
void chk_case(struct chk *h, const struct dsv4_plan_dims *dims, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Plan widths for a case: every width 1 (o_groups 1), the rest set by the case. */
struct dsv4_plan_dims chk_dims(void);
/* The projections the case passes to its op: prepared (backend.h prepare_weights) for each
 * run on a fresh context, and restored after it. Pointers stay the case's. */
void chk_weights(struct chk *h, struct dsv4_linear *const *ls, int n);
/* The next context to run the op on, NULL when the case is done (outputs compared, memory
 * of the case freed). */
struct dsv4_backend *chk_next(struct chk *h);
/* Whether the context chk_next returned is the reference's: a case computes inputs that need
 * an op (FP8-simulated rows) or reference values for a custom comparison in that run. */
bool chk_is_reference(const struct chk *h);

/* Output slot `slot` of this run: n values, filled from init (in-place ops) or with a
 * canary that a value the op should write but does not will show. For a backend whose
 * buffers are not host memory the pointer is its buffer (written by upload, read back by
 * download when the run ends): the case passes it to the op and never touches it. */
float   *chk_out_f32(struct chk *h, int slot, size_t n, struct chk_tol tol, const float *init, const float *mag);
int     *chk_out_int(struct chk *h, int slot, size_t n, const int *init);
uint8_t *chk_out_bytes(struct chk *h, int slot, size_t n, const uint8_t *init);
/* A comparison of the case's own instead of the slots' (run after each level's run): it
 * reads chk_ref / chk_got and reports through chk_note and chk_fail. */
void        chk_custom(struct chk *h, void (*fn)(struct chk *h, void *ud), void *ud);
const void *chk_ref(const struct chk *h, int slot);
const void *chk_got(const struct chk *h, int slot);
/* The default comparison of one slot (for custom comparisons that use it for some). */
void        chk_compare_slot(struct chk *h, int slot);
/* values compared, how many not bit-identical, the largest difference, and the largest as a
 * fraction of the difference the tolerance allows there (0 when not measured). */
void        chk_note(struct chk *h, size_t values, size_t differ, double max_abs, double max_used);
void        chk_fail(struct chk *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What the op of this run reads at host pointer p (memory of the case, anywhere inside an
 * allocation; NULL stays NULL): p itself, or for a backend whose buffers are not host memory
 * the same place in its uploaded twin of p's allocation (one per allocation and run, made
 * at the first call: call it after the run's host code has filled the inputs). */
void *chk_in(struct chk *h, const void *p);
/* bytes of memory the op may use as it likes (explicit scratch arguments), zero-filled:
 * backend memory for a backend whose buffers are not host memory, never read back. */
void *chk_work(struct chk *h, size_t bytes);

/* Memory of the case (freed when it ends; the check stops the op if none is left). */
void  *chk_alloc(struct chk *h, size_t bytes);
float *chk_floats(struct chk *h, size_t n);
/* Inputs: uniform in [-1, 1) times amp, rounded to bf16 (activations are bf16 values). */
void   chk_fill_bf16(struct chk *h, float *x, size_t n, float amp);
double chk_uniform(struct chk *h); /* [-1, 1) */
uint64_t chk_u64(struct chk *h);

/* ---- shapes shared by the cases: the widths of the presets of tools/gen.c */
struct chk_model {
    const char *name;
    int         d_model, n_head, d_head, d_rope, q_lora, o_groups, o_lora, window;
    int         n_idx_head, d_idx, topk, n_exp, n_used, d_ff, hc, hca_ratio;
    int         csa_ratio; /* the ratio of its layers with an indexer (overlapping compressor) */
};
extern const struct chk_model chk_models[3]; /* tiny-a, tiny-b, flash-shaped */

#endif /* DSV4_OP_CHECK_INT_H */
