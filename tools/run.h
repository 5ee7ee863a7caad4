/*
 * run.h - the pieces of `wna16 run`, the main job. tools/cmd_run.c calls
 * them in this order:
 *
 *   layer        run_default.c (the embedded default, made in memory) or
 *                run_checkpoint.c (one MoE layer of a checkpoint)
 *   activations  run_io.c (random with a seed, or --input)
 *   backend      run_backend.c (the best target present, selection for its
 *                platform, and what that target's fused MoE runs)
 *   repack       wna16_repack_layer on the target (cmd_run.c)
 *   fused MoE    run_moe_cpu.c or run_moe_cuda.c, timed by run_time.c
 *                (first call, kernel cache, cached calls)
 *   reference    run_reference.c (the scalar reference and the errors)
 *   report       run_report.c (progress lines, the summary or one JSON
 *                object) and -o (run_io.c)
 *
 * Progress goes to stdout, or to stderr with --json so that stdout holds
 * only the JSON object.
 */
#ifndef WNA16_TOOLS_RUN_H
#define WNA16_TOOLS_RUN_H

#include "cli.h"

#include <stdarg.h>

/* ---- options ---------------------------------------------------------------- */

typedef struct run_opts {
    const char *checkpoint; /* NULL: the embedded default */
    const char *layer;      /* --layer PREFIX */
    const char *input;      /* --input X.safetensors */
    const char *output;     /* -o Y.safetensors */
    const char *backend;    /* --backend NAME */
    long tokens;            /* --tokens M (default 16) */
    long experts;           /* --experts N (default layer only; 0 = all) */
    long seed;              /* --seed N (weights, activations, routing) */
    bool tokens_set;
    bool target_set;        /* --target given */
    wna16_target_t target;  /* --target: a target of runtime/targets.c */
    wna16_dtype_t dtype;    /* --dtype: the model's; INVALID: auto */
    bool json;
} run_opts_t;

/* ---- progress ---------------------------------------------------------------- */

typedef struct run_log {
    FILE *f;       /* stdout, or stderr with --json */
    int step;      /* last step number printed */
    double t0;     /* start of the run */
    double t_step; /* start of the current step */
} run_log_t;

double run_now(void);
void run_log_init(run_log_t *log, bool json);
/* "  N. text" and starts the step's clock. */
void run_log_step(run_log_t *log, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* "     text", a detail of the current step. */
void run_log_more(run_log_t *log, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Seconds since the current step started. */
double run_log_elapsed(const run_log_t *log);

/* ---- the layer -------------------------------------------------------------- */

typedef struct run_layer {
    const wna16_spec_t *format; /* the checkpoint format spec */
    wna16_checkpoint_t *ck;     /* NULL for the embedded default */
    /* The layer's tensors in the format's layout, under `prefix`: views of
     * the checkpoint's tensors, or of `parts` for the default. */
    wna16_tensor_set_t *tensors;
    wna16_tensor_set_t **parts; /* default: the storage, one set per expert */
    size_t n_parts;
    char prefix[512];
    char source[4200];          /* what the layer is, for the report */
    int32_t E, H, I, topk;
    wna16_quant_desc_t quant;
    wna16_dtype_t act_dtype;    /* random activations: F16 or BF16 */
    size_t n_tensors;           /* the layer's tensors in `tensors` */
    uint64_t bytes;             /* and their size */
    /* The default's logical form (the truth the tensors encode); the
     * reference reads it. A checkpoint's is decoded when needed. */
    wna16_qlayer_t logical;
    bool has_logical;
} run_layer_t;

/* The embedded default (run_default.c): Qwen3-30B-A3B's MoE layer shape
 * (H 2048, I 768, 128 experts, top-8), random int4 group-128 weights
 * encoded as GPTQ tensors through the gptq format spec. _shape sets the
 * sizes, format and quantization (so --input is checked before the
 * encoding's seconds); _make then makes the tensors. */
int run_default_shape(wna16_context_t *ctx, const run_opts_t *o,
                      run_layer_t *L);
int run_default_make(wna16_context_t *ctx, const run_opts_t *o,
                     run_layer_t *L, run_log_t *log);
/* One MoE layer of a checkpoint directory (run_checkpoint.c). */
int run_checkpoint_open(wna16_context_t *ctx, const run_opts_t *o,
                        run_layer_t *L, run_log_t *log);
/* Sets quant.bias, zeros_stored and g_idx_stored from the tensors present,
 * and counts them (run_checkpoint.c). */
void run_layer_finish(run_layer_t *L);
void run_layer_free(run_layer_t *L);

/* Calls fn(user, i, err) for i in [0, n) on up to run_threads() threads;
 * the first failure stops the others from starting new items and is
 * returned (run_par.c). */
typedef wna16_status_t (*run_item_fn)(void *user, size_t i, wna16_error_t *err);
wna16_status_t run_parallel(size_t n, run_item_fn fn, void *user,
                            wna16_error_t *err);
/* CPUs this process may run on. */
int run_threads(void);

/* ---- activations and output (run_io.c) --------------------------------------- */

typedef struct run_input {
    int32_t M, topk;
    wna16_dtype_t dtype; /* F16 or BF16: hidden states and the output */
    uint16_t *hidden;    /* [M][H] */
    int32_t *ids;        /* [M][topk] */
    float *weights;      /* [M][topk] */
    char source[4200];   /* "random (seed 1)" or the file */
} run_input_t;

/* Random activations in [-1, 1], top-k distinct random experts per token
 * with positive weights summing to 1. */
int run_input_random(const run_layer_t *L, int32_t M, uint64_t seed,
                     run_input_t *in);
/* hidden_states [M, H] (F16/BF16), topk_ids [M, topk] (I32/I64) and
 * topk_weights [M, topk] (F32/F16/BF16) from a safetensors file. */
int run_input_read(wna16_context_t *ctx, const char *path,
                   const run_layer_t *L, run_input_t *in);
void run_input_free(run_input_t *in);
/* Distinct experts the routing sends tokens to. */
int32_t run_input_experts(const run_input_t *in, int32_t E);
/* Writes `output` [M, H] in the input dtype (atomic: never a partial
 * file). */
int run_output_write(wna16_context_t *ctx, const char *path,
                     const run_input_t *in, int32_t H, const void *out,
                     const char *backend, const char *target);

/* ---- target and backend (run_backend.c) -------------------------------------- */

#define RUN_MAX_SKIPPED 16
typedef struct run_choice {
    wna16_target_t target;      /* where the fused MoE runs */
    /* the target's own fused MoE (wna16_cuda_moe_*) runs the layer; else
     * the generated one (wna16_moe_layer_*) */
    bool native_moe;
    wna16_device_info_t dev;
    char device[256];           /* what runs it, in words */
    const char *compiler;       /* the target's compiler, in words */
    wna16_platform_t platform;  /* selection's platform for the target */
    int32_t cc_major, cc_minor;
    wna16_select_result_t sel;
    wna16_status_t sel_status;
    char sel_error[WNA16_ERROR_MESSAGE_MAX];
    const wna16_spec_t *backend; /* the layout the fused MoE runs */
    bool substituted;            /* backend is not selection's answer */
    /* the CPU's vector features for the dedicated CPU kernels
     * (gen/moe_cpu.h), 0 on other targets */
    unsigned cpu_isa;
    char why[1024];              /* why, when substituted (or a note) */
    /* when substituted: the layouts tried before it, and why not */
    size_t n_skipped;
    struct {
        const wna16_spec_t *backend;
        char reason[512];
    } skipped[RUN_MAX_SKIPPED];
} run_choice_t;

/* The target: --target, else CUDA when a usable GPU is present, else the
 * CPU (saying why a GPU present is not used). */
int run_choose_target(wna16_context_t *ctx, const run_opts_t *o,
                      run_choice_t *c, run_log_t *log);
/* Selection for the target's platform, then the backend the target's
 * fused MoE runs; prints both and, when they differ, why. */
int run_choose_backend(wna16_context_t *ctx, const run_opts_t *o,
                       const run_layer_t *L, run_choice_t *c, run_log_t *log);

/* ---- the fused MoE and its figures (run_time.c, run_moe_*.c) ------------------------------ */

typedef struct run_figures {
    /* the repack */
    double repack_s;
    size_t packed_tensors;
    uint64_t packed_bytes;
    /* the fused MoE: the first call (kernels compiled or loaded from the
     * kernel cache), then `calls` cached calls */
    double first_ms, cached_ms, best_ms, cold_compile_ms;
    int calls;
    uint64_t compiled, from_disk;  /* kernels, during the first call */
    uint64_t from_packs;           /* and those from kernel packs */
    bool cache_hit;                /* none compiled */
    char cache_dir[4096];          /* "" when memory only */
    int threads;                   /* CPU target's threads */
    /* the numeric contract the GEMMs computed (wna16_moe_layer_numerics;
     * the reference runs under it) */
    wna16_numerics_t numerics;
    char kernels[2][160];          /* CUDA: the GEMM kernels */
    /* bandwidth: weights of the experts the routing touches */
    int32_t experts_touched;
    uint64_t bytes_per_expert, bytes_touched;
    double gbs;
    /* against the reference */
    double reference_s;
    double max_abs, max_ref, max_rel;
    /* output positions where the reference itself is NaN or infinite
     * (left out of the comparison), and the first non-finite input */
    size_t ref_nonfinite;
    char input_nonfinite[160];
    bool ok;
    double total_s;
} run_figures_t;

/* One timed call of a fused MoE: runs it, writes the output to the host
 * buffer `out` when it is not NULL, and returns the call's time in ms. */
typedef wna16_status_t (*run_call_fn)(void *user, void *out, double *ms,
                                      wna16_error_t *err);
/* The first call into `out` (kernel cache counters around it), then
 * cached calls until RUN_MIN_CALLS calls and RUN_MIN_SECONDS have passed
 * (at most RUN_MAX_CALLS): their median and best. */
#define RUN_MIN_CALLS 5
#define RUN_MAX_CALLS 200
#define RUN_MIN_SECONDS 0.5
int run_time_calls(wna16_context_t *ctx, run_call_fn call, void *user,
                   void *out, run_figures_t *f);

int run_moe_cpu(wna16_context_t *ctx, const run_layer_t *L,
                const run_choice_t *c, const wna16_tensor_set_t *packed,
                const run_input_t *in, void *out, run_figures_t *f,
                run_log_t *log);
int run_moe_cuda(wna16_context_t *ctx, const run_layer_t *L,
                 const run_choice_t *c, const wna16_tensor_set_t *packed,
                 const run_input_t *in, void *out, run_figures_t *f,
                 run_log_t *log);

/* ---- the reference (run_reference.c) ----------------------------------------- */

/* The run passes when max |kernel - reference| / max |reference| is at
 * most this (run_reference.c says why). */
#define RUN_REL_TOL 0x1p-5

/* The scalar reference MoE on the layer's logical form (the default's, or
 * the routed experts decoded from the checkpoint) into `ref`, then the
 * errors of `got` against it. */
int run_reference(wna16_context_t *ctx, const run_layer_t *L,
                  const run_input_t *in, const void *got, void *ref,
                  run_figures_t *f, run_log_t *log);

/* ---- report (run_report.c) --------------------------------------------------- */

void run_report_human(const run_layer_t *L, const run_choice_t *c,
                      const run_figures_t *f, run_log_t *log);
void run_report_json(const run_opts_t *o, const run_layer_t *L,
                     const run_input_t *in, const run_choice_t *c,
                     const run_figures_t *f);

#endif
