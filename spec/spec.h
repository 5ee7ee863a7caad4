/*
 * spec.h - the frozen, validated form of a spec (internal).
 *
 * Only spec/spec_load.c (and spec/spec_tiling.c, for the "tiling" section)
 * see cJSON; spec/spec_registry.c keeps the loaded specs. Everything else
 * (the reference, selection, the generator, the tools) reads these
 * structs, which are immutable once loaded and owned by the spec's arena.
 * See docs/specs.md for the JSON.
 */
#ifndef W16_SPEC_H
#define W16_SPEC_H

#include "spec/expr.h"

/* Roles a layout can fill. X(ENUM, json key, default tensor name, doc).
 * ORDER ROLE. */
#define W16_ROLE_LIST(X)                                                     \
    X(QWEIGHT, "qweight", "qweight", "quantized weight codes")               \
    X(SCALES, "scales", "scales", "per-group scales")                        \
    X(QZEROS, "qzeros", "qzeros", "per-group zero points")                   \
    X(G_IDX, "g_idx", "g_idx", "group index of each input channel")          \
    X(SORT_IDX, "g_idx_sort_indices", "g_idx_sort_indices",                  \
      "act-order permutation (argsort of g_idx)")                           \
    X(BIAS, "bias", "bias", "expert bias")                                   \
    X(WEIGHT, "weight", "weight", "dequantized weight values")               \
    X(GSCALE, "input_global_scale", "input_global_scale",                    \
      "global activation scale (unit of int16 scale codes)")

typedef enum w16_role {
#define X(e, key, name, doc) W16_ROLE_##e,
    W16_ROLE_LIST(X)
#undef X
    W16_ROLE_COUNT
} w16_role_t;

const char *w16_role_key(w16_role_t r);
const char *w16_role_doc(w16_role_t r);
/* The tensor leaf name a layout of this role has unless it names one. */
const char *w16_role_name(w16_role_t r);
/* The role's logical coordinates in array order (e first); returns count. */
int w16_role_coords(w16_role_t r, w16_var_t *out);

/* Logical coordinates of each role, in order. ORDER COORD. */
enum { W16_MAX_COORDS = 3 };

typedef struct w16_layout {
    w16_role_t role;
    const char *name;       /* tensor leaf name, e.g. "qweight" */
    const char *json_path;  /* "$.layouts.qweight", for messages */
    const w16_expr_t *when; /* NULL = always present */
    /* Storage dtype; for float roles several may be accepted (the first is
     * the one written unless the data's own dtype is in the list). */
    wna16_dtype_t dtypes[4];
    int n_dtypes;
    int ndim;
    const w16_expr_t *shape[W16_MAX_STORE_DIMS];
    /* forward: logical coordinates -> storage index and bit offset */
    const w16_expr_t *index[W16_MAX_STORE_DIMS];
    const w16_expr_t *bit; /* NULL = 0 */
    /* inverse: storage index + slot -> logical coordinates (role's order) */
    const w16_expr_t *coord[W16_MAX_COORDS];
    int n_coords;
    /* value transforms on codes: stored = encode(c), c = decode(stored) */
    const w16_expr_t *encode, *decode;
    /* Bits per stored value; NULL = BITS for codes, else the element. */
    const w16_expr_t *code_bits;
    /* Derived int32 sums of (q - z) over blocks of `sums_block_k` input
     * channels, stored little-endian at sums_index (coordinates e, n and
     * g = the block index) in this tensor; NULL when none (CPU VNNI). */
    const w16_expr_t *sums_block_k;
    const w16_expr_t *sums_index[W16_MAX_STORE_DIMS];
    /* Optional inverse of sums_index (storage index -> e, n, g of the sum
     * whose first byte is there; n = -1 elsewhere): lets the kernel that
     * writes the codes write the sums in the same pass (NULL = none). */
    const w16_expr_t *sums_coord[3];
    /* WEIGHT role: dtype the scale is rounded to before the product
     * (emulation: bf16(bf16(s) * (q - z))). */
    wna16_dtype_t dequant_scale_dtype;
    /* SCALES role, scale transforms for 8-bit activations (dims
     * expressions; NULL = none): `multiply` M stores round(s * M) in the
     * storage dtype (fp8: 512); `int16_codes` R > 0 stores
     * int16(round_half_even(s / max * R)), computed in the storage dtype and
     * bit-cast into its element, max being the operand's largest scale
     * (int8: 4096). See w16_scale_xform. */
    const w16_expr_t *scale_multiply, *scale_int16;
    /* SCALES and BIAS roles: the tensor is held in the model's dtype (vLLM
     * creates the parameter with params_dtype and its weight loader casts
     * the checkpoint's values into it); `dtypes` lists F16 and BF16. false:
     * the stored dtype does not depend on the model (CPU: F32). */
    bool model_dtype;
} w16_layout_t;

/* A selection rule: refuse with `reason` when every condition holds. */
typedef struct w16_rule {
    const char *reason;  /* may contain {platform} {activation} {format}
                            {bits} {group_size} {hidden} {scheme} */
    const w16_expr_t *cond; /* NULL = true */
    const char **formats; int n_formats;       /* format in list */
    const char **actorders; int n_actorders;   /* actorder in list */
    const char **act_not_in; int n_act_not_in; /* activation not in list */
    const char *json_path;
} w16_rule_t;

typedef struct w16_kernel_class {
    const char *name;
    w16_rule_t *rules;
    int n_rules;
} w16_kernel_class_t;

typedef struct w16_capabilities {
    int bits[4]; int n_bits;
    int group_sizes[8]; int n_group_sizes; /* 0 entries = any */
    bool zero_points, bias, act_order;
    bool standard_format, batched_format;
    const char **activations; int n_activations;
    const char **platforms; int n_platforms;
    int min_cc; /* 10*major+minor, 0 = none */
    /* Activation dtypes held (backends) or let through by the format's
     * integration (formats), by wna16_input_dtype_t; [16BIT] is always
     * true. */
    bool input_dtypes[WNA16_INPUT_COUNT_];
    w16_rule_t *shape_rules; int n_shape_rules;
    /* The numeric contracts its fused MoE computes (wna16_numerics_t),
     * vLLM's kernel's own first ("numerics"; default ["f32"]). */
    wna16_numerics_t numerics[WNA16_NUMERICS_COUNT_]; int n_numerics;
} w16_capabilities_t;

/* Backend-only: selection data reproducing vLLM's oracle. */
typedef struct w16_backend_select {
    const char *vllm_name;   /* "MARLIN" */
    const char *by_name;     /* name accepted for an explicit request, or
                                NULL when the backend cannot be named */
    int priority[WNA16_PLATFORM_COUNT_]; /* 1 = first; 0 = not listed */
    w16_rule_t *gate; int n_gate;        /* _backend_incompatibility_reason */
    w16_kernel_class_t *classes; int n_classes; /* is_supported_config */
    /* Platforms whose wna16 kernel target serves this backend. */
    bool kernel_platforms[WNA16_PLATFORM_COUNT_];
} w16_backend_select_t;

/* Format-only: how vLLM's integration sees a checkpoint of this format. */
typedef struct w16_format_select {
    const char *integration; /* "AutoGPTQ" */
    w16_rule_t *errors; int n_errors; /* configs the integration rejects */
    const w16_expr_t *may_have_zp, *may_have_bias, *allow_tile_padding;
    const w16_expr_t *wk_bits, *wk_group32, *wk_asym;
    const char *fallback_format; /* e.g. "moe_wna16"; NULL = none */
    const w16_expr_t *fallback_if;
    const char *fallback_reason;
} w16_format_select_t;

/* How config.json names this format. */
typedef struct w16_format_config {
    const char **quant_methods; int n_quant_methods;
} w16_format_config_t;

typedef struct w16_spec_proj {
    const char *names[4]; int n_names; /* "gate_proj", "w1" */
} w16_spec_proj_t;

/* Tile shapes of the CUDA fused-MoE GEMM (templates/moe_marlin_gemm.cu),
 * chosen per problem from a backend spec's "tiling" section
 * (docs/specs.md, section 14; gen/spec_tiling.c loads and checks it).
 * Both lists are first-match tables whose last row has no condition, so
 * every problem gets a shape. */
typedef struct w16_tile_bm {
    int64_t tpe_lo, tpe_hi; /* routed slots per expert, inclusive */
    int block_m;            /* 16, 32, 48 or 64 (wgmma: 64 or 128): also
                               the routing block */
    bool wgmma;             /* "mma": "wgmma": only where wgmma runs */
    const char *json_path;
} w16_tile_bm_t;

typedef struct w16_tile_rule {
    int gemm;               /* -1 either, else a wna16_gemm_t */
    int64_t bm_lo, bm_hi;   /* block_m range, inclusive */
    int64_t n_lo, n_hi;     /* GEMM output columns N, inclusive */
    int64_t k_lo, k_hi;     /* GEMM reduction size K, inclusive */
    int block_n;            /* multiple of 64, <= 256 */
    int block_k;            /* 64, 128 or 256 (halved to divide K) */
    int warps_n, warps_k;   /* powers of two */
    int stages;             /* cp.async pipeline depth, 2 .. 8 */
    /* split-K: at most max_split_k (a power of two, 1 = none) K slices a
     * tile, chosen at run time as the fewest that give ctas_per_sm CTAs
     * for every SM on the problem's expected row blocks */
    int max_split_k, ctas_per_sm;
    /* CTAs per SM the compiler must fit in registers (launch bounds) */
    int min_ctas;
    /* "mma": "wgmma": templates/moe_wgmma_gemm.cu, for the block_m rows
     * marked the same way (and only those) */
    bool wgmma;
    /* grouped scales multiplied into B in the inner loop instead of once
     * per group on float32 partial sums (the template's DEFER) */
    bool scales_in_b;
    /* wgmma rows: a producer warpgroup issues the copies into a ring of
     * stages guarded by mbarriers (templates/moe_wgmma_gemm.cu, WS) */
    bool warp_specialized;
    /* warp-specialized wgmma rows: grouped scales applied to the float32
     * accumulators at each group change (codes only in the A operand) */
    bool scales_on_acc;
    /* warp-specialized wgmma rows: wgmma groups in flight, 1 or 2 */
    int wgmma_groups;
    /* warp-specialized wgmma rows, 4-bit codes: stage copies of 8-byte
     * halves so that a warp reads whole 16-byte vectors (two k16 steps) */
    bool split_codes;
    /* warp-specialized wgmma rows of two slices: the first tail_m (0, 16
     * or 32) rows of an expert's next block, when they are its last,
     * computed by this block's CTA beside its own (templates/
     * moe_wgmma_gemm.cu, TAIL_M) */
    int tail_m;
    /* warp-specialized wgmma rows: one CTA an SM for the whole GEMM, over
     * the (row block, column tile) items the routing filled; its producer
     * copies the next item's stages during this item's epilogue
     * (templates/moe_wgmma_gemm.cu, PERSIST) */
    bool persistent;
    const char *json_path;
} w16_tile_rule_t;

typedef struct w16_tiling {
    const char *description;
    w16_tile_bm_t *bm; int n_bm;
    w16_tile_rule_t *gemm; int n_gemm;
} w16_tiling_t;

/* Most shared memory one CTA may use on any device the tiling targets
 * (sm_90: 227 KiB); a device with less refuses a shape at run time. */
#define W16_TILING_MAX_SHARED 232448

/* Whether the GEMM templates instantiate block_m (their static_asserts):
 * wgmma's N (16, 32, 48, 64, 128, 256); mma.sync's m16 blocks (16-64)
 * and its swapped n8 blocks of rows (8, 24). */
bool w16_tile_block_m_ok(int block_m, bool wgmma);
/* Shared memory of a GEMM CTA of this shape (the template's formula):
 * `scale_rows` is the rows of 64 scales a tile that a stage carries
 * (block_k / 16 at most: groups are multiples of 16); `persistent`: the
 * C tile has memory of its own beside the stages, w16_tile_c_rows rows. */
size_t w16_tile_shared_bytes(int block_m, int block_n, int block_k,
                             int stages, int bits, int scale_rows,
                             bool wgmma, bool persistent);
/* A persistent wgmma CTA's C tile rows at a time: the most whole 16-row
 * groups, up to block_m, that fit beside its stages within
 * W16_TILING_MAX_SHARED less W16_TILING_STATIC_SHARED (16 at least: a
 * shape whose stages leave less exceeds the maximum). */
int w16_tile_c_rows(int block_m, int block_n, int block_k, int stages,
                    int bits, int scale_rows);
/* What the wgmma template's static shared arrays may take (row ids,
 * barriers) beside the dynamic shared memory. */
#define W16_TILING_STATIC_SHARED 4096
/* The block_m row for `tokens_per_expert` routed slots per expert; rows
 * marked wgmma count only when `wgmma_ok` (an sm_90 device, no act
 * order). */
const w16_tile_bm_t *w16_tiling_block_m(const w16_tiling_t *t,
                                        int64_t tokens_per_expert,
                                        bool wgmma_ok);
/* The GEMM row for a problem: among the wgmma rows when the block_m row
 * was a wgmma one, else among the others. */
const w16_tile_rule_t *w16_tiling_gemm(const w16_tiling_t *t, bool wgmma,
                                       int block_m,
                                       wna16_gemm_t gemm, int64_t N,
                                       int64_t K);

/* Workgroup shapes of the generated (portable) fused MoE (gen/build_moe.c)
 * over this layout, chosen per expert run from a backend spec's
 * "tiling.portable" list (docs/specs.md, section 14): a first-match table
 * whose last row has no condition. */
typedef struct w16_ptile {
    int64_t tpe_lo, tpe_hi; /* the run's routed slots, inclusive */
    int rows;               /* token rows a GEMM lane carries through one
                               pass over K (the request's block_m): 1, 2
                               or 4 */
    int workgroup;          /* GEMM lanes a workgroup (the request's lanes):
                               a power of two, 16 .. 256 */
    const char *json_path;
} w16_ptile_t;

typedef struct w16_ptiling {
    w16_ptile_t *row; int n_row;
} w16_ptiling_t;

/* The row for an expert run of `slots` routed slots. */
const w16_ptile_t *w16_ptiling_pick(const w16_ptiling_t *t, int64_t slots);

/* Whether wna16's generated fused MoE takes the batched activation format
 * over this backend's layout. A spec with a "tiling.portable" table is one
 * whose generated fused MoE stands for the backend's own kernel (xpu:
 * vLLM's XPUExpertsWNA16, run as SPIR-V by the xpu and ocl targets), so it
 * takes the formats that kernel does (capabilities.activation_formats);
 * over any other stacked layout the generated fused MoE is wna16's own
 * and takes both (the CPU runs the Triton layout batched, which vLLM's
 * TritonWNA16Experts does not). */
bool w16_spec_moe_takes_batched(const wna16_spec_t *s);

struct wna16_spec {
    wna16_context_t *ctx;
    w16_arena_t arena; /* owns everything below */
    wna16_spec_kind_t kind;
    const char *name, *title, *description, *origin;
    int version;
    /* Hash of the spec's JSON text (every kernel cache key includes it). */
    uint64_t content_hash[2];

    w16_table_t *tables; int n_tables;
    w16_capabilities_t caps;

    /* Act-order layouts store K in the order of the stable per-expert
     * argsort of g_idx: codes read through the permutation, g_idx sorted,
     * the permutation in the g_idx_sort_indices layout (Marlin). */
    bool act_order_sort;
    /* Formats: vLLM's integration creates g_idx parameters for every layer,
     * whether or not the checkpoint holds g_idx tensors (compressed-tensors'
     * MoE method), so layouts that keep them (Marlin's (E, 0) g_idx) see
     * G_IDX_STORED = 1. */
    bool g_idx_params;
    /* Dims: padded intermediate size (NULL = I). */
    const w16_expr_t *pad_intermediate;
    const char *pad_forbidden_with_act_order; /* reason, NULL = allowed */
    /* CUDA fused-MoE tile shapes; NULL when the backend has none. */
    const w16_tiling_t *tiling;

    /* Layouts, by role; NULL where the spec has none. */
    const w16_layout_t *layouts[W16_ROLE_COUNT];
    /* Tensors are stacked per layer ("{prefix}.w13_{name}") rather than
     * per expert and projection ("{prefix}.{e}.{proj}.{name}"). */
    bool stacked;
    w16_spec_proj_t proj_gate, proj_up, proj_down;
    /* The generated fused MoE's workgroup shapes ("tiling.portable");
     * NULL: its defaults. */
    const w16_ptiling_t *portable_tiling;

    /* Zero-point convention, in words, for explain: "stored z-1" etc. */
    const char *zero_convention;
    /* Format-only */
    w16_format_config_t config;
    w16_format_select_t fsel;
    /* Backend-only */
    w16_backend_select_t bsel;

    /* Sample problems for the layout consistency check. */
    struct w16_sample {
        int64_t E, H, I, BITS, GS, ZP, ACT_ORDER, HAS_BIAS, ZEROS_STORED,
            G_IDX_STORED, A8;
    } *samples;
    int n_samples;

    /* The problems w16_spec_check_problem has proved the layouts for, so
     * that it runs once per problem and spec (spec_check.c: made with the
     * spec, freed with it, safe to use from several threads). */
    struct w16_spec_memo *memo;
};

/* ---- registry (spec_registry.c) and loader (spec_load.c) ---------------- */

typedef struct w16_embedded_spec {
    const char *origin; /* "builtin:specs/backends/marlin.json" */
    const char *text;
    size_t len;
} w16_embedded_spec_t;

extern const w16_embedded_spec_t w16_embedded_specs[];

wna16_status_t w16_specs_init(wna16_context_t *ctx, bool builtin,
                              const char *dir, wna16_error_t *err);
void w16_specs_fini(wna16_context_t *ctx);

/* Parses and validates without registering. Caller frees with
 * w16_spec_free. */
wna16_status_t w16_spec_parse(wna16_context_t *ctx, const char *origin,
                              const char *text, size_t len,
                              wna16_spec_t **out, wna16_error_t *err);
void w16_spec_free(wna16_spec_t *spec);

/* What the layout checks evaluated (spec_check.c, spec_map.c,
 * spec_prove.c): the cost of a check, and how each layout was settled. */
typedef struct w16_check_stats {
    int64_t evaluated;  /* elements and places whose maps were evaluated */
    int64_t most;       /* the most one sample (or one problem) evaluated */
    int exhaustive;     /* map pairs walked element by element */
    int proved;         /* map pairs proved from their structure */
    int sampled;        /* map pairs only probed (real sizes, unprovable) */
    int memo_hits;      /* problems found already proved */
} w16_check_stats_t;

/* The most elements and places the check of one sample may evaluate: a
 * layout is walked whole while that fits, proved from its maps' structure
 * beyond (spec_prove.c), and refused as "too large to check" when neither
 * fits (docs/specs.md, section 6). */
#define W16_SAMPLE_BUDGET (INT64_C(1) << 20)

/* Checks every layout of the spec on its sample problems: forward and
 * inverse maps agree and are bijective onto the stored elements. `full`
 * runs all samples; otherwise only the first. */
wna16_status_t w16_spec_check_layouts(const wna16_spec_t *spec, bool full,
                                      wna16_error_t *err);
/* The same, adding what it evaluated to *stats. */
wna16_status_t w16_spec_check_layouts_stats(const wna16_spec_t *spec,
                                            bool full,
                                            w16_check_stats_t *stats,
                                            wna16_error_t *err);
/* The memo of w16_spec_check_problem, made with a spec and freed with it
 * (spec_load.c). */
wna16_status_t w16_spec_memo_new(wna16_spec_t *spec, wna16_error_t *err);
void w16_spec_memo_free(wna16_spec_t *spec);

/* Loads "tiling" (backend specs) into spec->tiling (the CUDA tables,
 * "block_m" and "gemm") and spec->portable_tiling ("portable"); errors name `origin`
 * and the JSON path. `j` is a cJSON node (spec loaders only). */
struct cJSON;
wna16_status_t w16_spec_load_tiling(wna16_spec_t *spec, const struct cJSON *j,
                                    const char *origin, wna16_error_t *err);

/* ---- binding a layout to a problem -------------------------------------- */

/* The variables of one GEMM operand of one problem. */
typedef struct w16_problem {
    int64_t E, H, I, BITS, GS;
    bool zp, act_order, bias;
    /* what the source checkpoint carries besides what the math uses */
    bool zeros_stored, g_idx_stored;
    int a8; /* 8-bit activations: 0 none, 1 int8, 2 fp8 */
    /* A non-gated MLP (the *_no_mul activations): a stacked w13 holds one
     * projection, N = IP, instead of [gate; up]. */
    bool ungated;
    /* The model's dtype (F16/BF16) the loader casts scales and biases to
     * before any layout sees them (wna16_quant_desc_t.model_dtype);
     * WNA16_DTYPE_INVALID: no cast. Layouts never bind it. */
    wna16_dtype_t model_dtype;
} w16_problem_t;

/* Fills vars[] (dims only) for the given operand; computes IP from the
 * spec's padding rule. Stacked specs describe the whole operand (w13:
 * K = H, N = 2*IP, or IP when ungated; w2: K = IP, N = H); per-expert
 * format specs describe one projection (gate/up: K = H, N = I; down:
 * K = I, N = H). Fails if the
 * padding expression fails or the dimensions are inconsistent (GS not
 * dividing K, ...). */
wna16_status_t w16_spec_bind(const wna16_spec_t *spec,
                             const w16_problem_t *p, wna16_gemm_t gemm,
                             int64_t *vars, wna16_error_t *err);

/* Proves every layout of `spec` for the concrete problem p (both
 * operands, the sizes a repack or a fused MoE will use): each forward map
 * lands inside its shape at a whole slot, the inverse map reads every
 * element back (so no two share a place) and every other place as
 * padding, block sums stay clear of codes and of each other, and the value
 * and scale transforms hold. A layout is walked whole when small, else
 * proved from its maps' structure (spec_prove.c), else probed on a bounded
 * sample with a warning. Refuses with WNA16_ESPEC and "<spec origin>:
 * <JSON path> (<problem>, w13): ..." naming the elements that collide or
 * the element out of bounds, or the expression that fails to evaluate
 * (division by zero, ...). Problems the spec does not claim to hold (its
 * capabilities' bits and group sizes, its rules, sizes that do not bind)
 * pass untouched: w16_check_holds refuses them with their reason. Runs
 * once per problem and spec (a memo); stats may be NULL. */
wna16_status_t w16_spec_check_problem(const wna16_spec_t *spec,
                                      const w16_problem_t *p,
                                      w16_check_stats_t *stats,
                                      wna16_error_t *err);

/* Is this layout present for the bound problem ("when")? */
bool w16_layout_present(const w16_layout_t *l, const int64_t *vars);

/* Evaluates the stored shape; false with a message on failure. */
wna16_status_t w16_layout_shape(const w16_layout_t *l, const int64_t *vars,
                                int64_t *shape, wna16_error_t *err);

/* Bits of one logical value in this layout: BITS for codes, else the
 * storage element's width. */
int w16_layout_code_bits(const w16_layout_t *l, wna16_dtype_t dtype,
                         const int64_t *vars);
/* Number of logical values per storage element (packed codes), >= 1. */
int w16_layout_slots(const w16_layout_t *l, wna16_dtype_t dtype,
                     const int64_t *vars);

/* Sizes of the logical domain of a role for the bound operand, in the
 * role's coordinate order (e, then n/k or g/n). */
int w16_role_extent(w16_role_t r, const int64_t *vars, int64_t *ext);

/* Forward map: logical coordinates (in role order) -> storage index and bit
 * offset. vars is modified (coordinates written). */
bool w16_layout_locate(const w16_layout_t *l, int64_t *vars,
                       const int64_t *coord, int64_t *index, int64_t *bit,
                       w16_eval_error_t *e);
/* Inverse map: storage index + slot -> logical coordinates (role order). */
bool w16_layout_coord(const w16_layout_t *l, int64_t *vars,
                      const int64_t *index, int64_t slot, int64_t *coord,
                      w16_eval_error_t *e);

/* The scale transforms of a SCALES layout for the bound operand: multiply
 * (a power of two, 1 = none) and the int16 code range (0 = none). Fails
 * with the layout's path when an expression fails or is out of range
 * (multiply: a power of two up to 2^16; range: 0 to 32767; not both), or
 * when input_global_scale is present without int16 codes or missing with
 * them. */
typedef struct w16_scale_xform {
    int64_t multiply;
    int64_t int16_range;
} w16_scale_xform_t;

wna16_status_t w16_scale_xform(const wna16_spec_t *spec, const int64_t *vars,
                               w16_scale_xform_t *out, wna16_error_t *err);

#endif /* W16_SPEC_H */
