/*
 * bench_moe.c - the generated fused MoE on the CPU, on the Qwen3-30B-A3B
 * MoE layer (H 2048, I 768, 128 experts, top-8; by default int4 group 128,
 * bf16 activations, silu, the triton layout), against this machine's
 * streaming read rate measured in the same run. A program, not a test.
 *
 * In order:
 *   1. a random layer in logical form, encoded into the layout by the
 *      reference encoder (17 distinct experts by default, expert e
 *      repeating expert e mod 17, so that the scalar encoder takes seconds;
 *      the bytes read are the same), and C + 1 copies of the encoded
 *      weights, each bound to its own layer (C for the fresh rows, from
 *      the last-level cache; one for the hot rows);
 *   2. the layer's output checked against the reference fused MoE under
 *      the numeric contract the layer reports (wna16_ref_moe_numerics) at
 *      every M, with the tolerance the tests state (tests/moe/
 *      test_moe_gen.c, check_close): a mismatch exits 1 before anything is
 *      timed;
 *   3. rounds; each measures the streaming baseline (AVX-512 loads, AVX2 on
 *      hosts without AVX-512, over >= 1 GiB, on the fused MoE's thread
 *      count, several passes) and then every row, in alternating order, so
 *      that the machine's other load touches every row alike.
 *
 * Rows, for each M:
 *   fresh  every call reads its weights from DRAM: a random routing (top-k
 *          distinct experts a token) relabelled onto the experts of the
 *          copy read least recently (experts are alike, so the work is the
 *          same), so that at least 2x the LLC of other weights is read
 *          between two reads of an expert; the table prints the smallest
 *          such distance seen, as a multiple of the LLC;
 *   hot    a control: one routing, the same experts every call, so the
 *          weights stay in the caches as far as they fit.
 * Columns: time per call (median [best] over every round's calls); GFLOP/s
 * from the median, 2 M topk (2I H + H I) (every routed slot's work);
 * distinct experts and MB of weights a call reads (experts x bytes of an
 * expert, scales and zero points included, the mean of the calls); weight
 * GB/s (those bytes / the median [best] time) and its % of the baseline's
 * best pass; "bound": the GFLOP/s that reading those bytes once at the
 * baseline's best rate would allow (the row's FLOPs / (MB/call / baseline
 * GB/s)), so a reader sees whether a GFLOP/s target is reachable at that
 * M at all (it is not where the bound is below it); the numeric contract
 * of the kernels (bench_contract).
 *
 *   bench_moe [--layout triton] [--bits 4] [--group 128] [--m 1,2,4,...]
 *             [--threads N] [--rounds 7] ...        (bench_moe --help)
 *
 * Progress goes to stderr, the results to stdout.
 */
#define _GNU_SOURCE
#include "wna16.h"
#include "bench/bench_util.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/pool.h"
#include "runtime/ref/moe_bound.h" /* w16_act_ulp */

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BENCH_X86 1
#include <immintrin.h>
#endif

enum { E = 128, H = 2048, I = 768, TOPK = 8, MAX_M = 32, MAX_COPIES = 64 };

/* ---- options ---------------------------------------------------------------- */

typedef struct opts {
    const char *layout;
    int bits, group;
    bool zero_point;
    wna16_dtype_t dtype;    /* activations and the model's scales */
    int Ms[MAX_M], nM;
    int threads;            /* 0: the library's default (one a core) */
    int rounds;
    double min_ms;          /* timed calls of a row in a round: at least this */
    int check_tokens;       /* tokens of each M checked against the reference */
    int copies;             /* 0: from the LLC */
    int distinct;           /* experts with weights of their own */
    double llc_mib;         /* 0: as the CPU reports it */
    double stream_mib;      /* the baseline's buffer */
    int passes;             /* baseline passes a round */
    uint64_t seed;
} opts_t;

static const char usage[] =
    "usage: bench_moe [options]\n"
    "The generated CPU fused MoE on the Qwen3-30B-A3B layer (H 2048, I 768,\n"
    "128 experts, top-8, silu) against a streaming read of memory measured\n"
    "in the same run. Checks the output against the reference first (exit 1\n"
    "on a mismatch), then times fresh-from-DRAM and cache-hot rows per M.\n"
    "\n"
    "  --layout NAME     backend layout of the weights (triton, cpu, marlin,\n"
    "                    xpu, humming, ...; default triton)\n"
    "  --bits B          4 or 8 (default 4)\n"
    "  --group G         group size, -1 for channelwise (default 128)\n"
    "  --zero-point      asymmetric weights (explicit zero points)\n"
    "  --dtype D         bf16 or f16 activations and scales (default bf16)\n"
    "  --m LIST          token counts, comma-separated (default\n"
    "                    1,2,4,8,16,32,64,128,256)\n"
    "  --threads N       threads of the fused MoE and of the baseline\n"
    "                    (default: $WNA16_NUM_THREADS, else one a core)\n"
    "  --rounds R        rounds (default 7)\n"
    "  --min-ms T        timed calls of a row in a round last at least T ms\n"
    "                    (at least 3 calls; default 20)\n"
    "  --check-tokens N  tokens of each M compared with the reference (all\n"
    "                    when M <= N; default 8)\n"
    "  --distinct N      experts with weights of their own; expert e repeats\n"
    "                    expert e mod N (default 17; 128 encodes every expert\n"
    "                    with the scalar reference encoder: minutes)\n"
    "  --copies C        copies of the layer the fresh rows rotate through\n"
    "                    (default: enough for 2x the LLC between reuses;\n"
    "                    the hot rows have one more of their own)\n"
    "  --llc-mib X       the last-level cache size (default: as the CPU\n"
    "                    reports it)\n"
    "  --stream-mib X    the baseline's buffer (default and minimum 1024,\n"
    "                    at least 2x the LLC)\n"
    "  --passes P        baseline passes a round (default 3)\n"
    "  --seed S          random seed (default 1)\n"
    "  -h, --help        this text\n"
    "Environment: WNA16_CACHE_DIR (kernel cache), WNA16_NUM_THREADS.\n";

static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench_moe: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static bool parse_num(const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

/* 0: parsed; 1: bad usage (said); 2: --help printed. */
static int parse_opts(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.layout = "triton", .bits = 4, .group = 128,
                  .dtype = WNA16_DTYPE_BF16, .rounds = 7, .min_ms = 20,
                  .check_tokens = 8, .distinct = 17, .stream_mib = 1024,
                  .passes = 3,
                  .seed = 1};
    static const int def_m[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    o->nM = (int)(sizeof def_m / sizeof def_m[0]);
    memcpy(o->Ms, def_m, sizeof def_m);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        int n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 2;
        } else if (!strcmp(a, "--zero-point")) {
            o->zero_point = true;
            takes = false;
        } else if (!strcmp(a, "--layout")) {
            ok = v != NULL;
            o->layout = v;
        } else if (!strcmp(a, "--bits")) {
            ok = parse_int(v, 4, 8, &o->bits) && (o->bits == 4 || o->bits == 8);
        } else if (!strcmp(a, "--group")) {
            ok = parse_int(v, -1, H, &o->group) && o->group != 0;
        } else if (!strcmp(a, "--dtype")) {
            ok = v && (!strcmp(v, "bf16") || !strcmp(v, "f16"));
            o->dtype = v && !strcmp(v, "f16") ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
        } else if (!strcmp(a, "--m")) {
            o->nM = 0;
            for (const char *p = v; ok && p && *p;) {
                char *end;
                long m = strtol(p, &end, 10);
                ok = end != p && m >= 1 && m <= 4096 && o->nM < MAX_M &&
                     (*end == ',' || !*end);
                if (ok)
                    o->Ms[o->nM++] = (int)m;
                p = *end ? end + 1 : end;
            }
            ok = ok && o->nM > 0;
        } else if (!strcmp(a, "--threads")) {
            ok = parse_int(v, 1, WNA16_MAX_CPU_THREADS, &o->threads);
        } else if (!strcmp(a, "--rounds")) {
            ok = parse_int(v, 1, 1000, &o->rounds);
        } else if (!strcmp(a, "--min-ms")) {
            ok = parse_num(v, 0, 1e5, &o->min_ms);
        } else if (!strcmp(a, "--check-tokens")) {
            ok = parse_int(v, 1, 4096, &o->check_tokens);
        } else if (!strcmp(a, "--distinct")) {
            ok = parse_int(v, 1, E, &o->distinct);
        } else if (!strcmp(a, "--copies")) {
            ok = parse_int(v, 1, MAX_COPIES, &o->copies);
        } else if (!strcmp(a, "--llc-mib")) {
            ok = parse_num(v, 1, 1 << 20, &o->llc_mib);
        } else if (!strcmp(a, "--stream-mib")) {
            ok = parse_num(v, 1024, 1 << 20, &o->stream_mib);
        } else if (!strcmp(a, "--passes")) {
            ok = parse_int(v, 1, 1000, &o->passes);
        } else if (!strcmp(a, "--seed")) {
            ok = parse_int(v, 0, 1L << 30, &n);
            o->seed = (uint64_t)n;
        } else {
            fail("unknown option '%s' (--help lists them)", a);
            return 1;
        }
        if (!ok) {
            fail("bad value '%s' for %s (--help)", v ? v : "(none)", a);
            return 1;
        }
        i += takes;
    }
    return 0;
}

/* ---- small helpers ------------------------------------------------------------ */

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Sorts v and returns its median. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    if (!n)
        return 0.0;
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double load_now(void)
{
    double l[1] = {-1};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

static float from_act(wna16_dtype_t dt, uint16_t b)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f16_to_f32(b) : wna16_bf16_to_f32(b);
}

static uint16_t to_act(wna16_dtype_t dt, float v)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v) : wna16_f32_to_bf16(v);
}

/* The last-level cache as the CPU reports it (bytes), 0 if unknown. */
static double llc_bytes(void)
{
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v > 0)
        return (double)v;
    v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? (double)v : 0.0;
}

/* ---- the streaming baseline --------------------------------------------------- */

/* Reads a buffer once with the widest loads the host has, split in pieces
 * over a pool of the fused MoE's thread count: the rate at which this
 * machine streams memory into registers, what a memory-bound decode call
 * can at best reach. Each piece XORs its lines into independent
 * accumulators (no dependence between loads). */
typedef enum isa { ISA_SCALAR, ISA_AVX2, ISA_AVX512 } isa_t;

static const char *isa_name(isa_t i)
{
    return i == ISA_AVX512 ? "AVX-512 (64-byte loads)"
           : i == ISA_AVX2 ? "AVX2 (32-byte loads; this host has no AVX-512)"
                           : "scalar 64-bit loads (not an x86-64 host with AVX2)";
}

#ifdef BENCH_X86
__attribute__((target("avx512f"))) static uint64_t read_avx512(const void *p,
                                                               size_t n)
{
    const __m512i *v = p;
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i + 4 <= n / 64; i += 4) {
        a = _mm512_xor_si512(a, _mm512_load_si512(v + i));
        b = _mm512_xor_si512(b, _mm512_load_si512(v + i + 1));
        c = _mm512_xor_si512(c, _mm512_load_si512(v + i + 2));
        d = _mm512_xor_si512(d, _mm512_load_si512(v + i + 3));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    uint64_t lane[8];
    _mm512_storeu_si512(lane, a);
    return lane[0] ^ lane[3] ^ lane[5] ^ lane[7];
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const void *p,
                                                          size_t n)
{
    const __m256i *v = p;
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 4 <= n / 32; i += 4) {
        a = _mm256_xor_si256(a, _mm256_load_si256(v + i));
        b = _mm256_xor_si256(b, _mm256_load_si256(v + i + 1));
        c = _mm256_xor_si256(c, _mm256_load_si256(v + i + 2));
        d = _mm256_xor_si256(d, _mm256_load_si256(v + i + 3));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t lane[4];
    _mm256_storeu_si256((__m256i *)lane, a);
    return lane[0] ^ lane[3];
}
#endif

static uint64_t read_scalar(const void *p, size_t n)
{
    const uint64_t *v = p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        a ^= v[i];
        b ^= v[i + 1];
        c ^= v[i + 2];
        d ^= v[i + 3];
    }
    return a ^ b ^ c ^ d;
}

static isa_t host_isa(void)
{
#ifdef BENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2"))
        return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

enum { PIECE = 1 << 20 }; /* bytes a work item reads */

typedef struct stream {
    unsigned char *buf;
    size_t bytes;
    isa_t isa;
    w16_pool_t *pool;
    _Atomic uint64_t sink;
    double *gbs; /* every pass's GB/s */
    int n, cap;
} stream_t;

static void stream_pieces(void *user, int64_t begin, int64_t end)
{
    stream_t *s = user;
    uint64_t x = 0;
    for (int64_t i = begin; i < end; i++) {
        const unsigned char *p = s->buf + (size_t)i * PIECE;
#ifdef BENCH_X86
        if (s->isa == ISA_AVX512)
            x ^= read_avx512(p, PIECE);
        else if (s->isa == ISA_AVX2)
            x ^= read_avx2(p, PIECE);
        else
#endif
            x ^= read_scalar(p, PIECE);
    }
    atomic_fetch_xor(&s->sink, x);
}

/* The buffer: mapped with transparent huge pages advised, as the library
 * maps the tensors that hold the weights (w16_alloc_bulk), and written
 * (untouched pages would all read the one zero page). */
static bool stream_init(stream_t *s, size_t bytes, int threads)
{
    *s = (stream_t){.bytes = bytes / PIECE * PIECE, .isa = host_isa()};
    void *p = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, s->bytes, MADV_HUGEPAGE);
#endif
    s->buf = p;
    uint64_t *w = p;
    for (size_t i = 0; i < s->bytes / 8; i++)
        w[i] = i * 0x9e3779b97f4a7c15ull;
    s->pool = w16_pool_create(threads);
    return s->pool != NULL;
}

static void stream_pass(stream_t *s)
{
    double t0 = bench_seconds();
    w16_pool_run(s->pool, (int64_t)(s->bytes / PIECE), stream_pieces, s);
    double dt = bench_seconds() - t0;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->gbs = realloc(s->gbs, sizeof(double) * (size_t)s->cap);
    }
    s->gbs[s->n++] = (double)s->bytes / dt / 1e9;
}

static void stream_fini(stream_t *s)
{
    if (s->buf)
        munmap(s->buf, s->bytes);
    w16_pool_destroy(s->pool);
    free(s->gbs);
}

/* ---- the layer ------------------------------------------------------------------ */

/* One operand with random codes (and zero points) and scales m/128 *
 * 2^-sh, m < 128: exact in bf16 and f16, |W| about 1/sqrt(K) so h, a and
 * the output stay about 1 (as in tests/moe/test_moe_gen.c). */
static wna16_status_t operand(wna16_qweight_t *qw, int32_t N, int32_t K,
                              const opts_t *o, wna16_error_t *err)
{
    wna16_status_t st = wna16_qweight_alloc(qw, E, N, K, o->bits, o->group,
                                            o->zero_point, false, false, err);
    if (st != WNA16_OK)
        return st;
    qw->scale_dtype = o->dtype;
    qw->bias_dtype = o->dtype;
    size_t nc = (size_t)o->distinct * N * K, ng = (size_t)o->distinct * qw->G * N;
    uint8_t mask = (uint8_t)((1u << o->bits) - 1);
    for (size_t i = 0; i < nc; i += 8) {
        uint64_t r = next();
        for (size_t j = 0; j < 8 && i + j < nc; j++)
            qw->codes[i + j] = (uint8_t)(r >> (8 * j)) & mask;
    }
    int sh = o->bits - 1;
    for (int32_t k = K; k > 1; k /= 4)
        sh++;
    for (size_t i = 0; i < ng; i++)
        qw->scales[i] = ldexpf((float)(1 + next() % 127) / 128.0f, -sh);
    if (qw->zeros)
        for (size_t i = 0; i < ng; i++)
            qw->zeros[i] = (uint8_t)next() & mask;
    for (int e = o->distinct; e < E; e++) { /* expert e = expert e mod N */
        size_t src = (size_t)(e % o->distinct), ce = (size_t)N * K,
               ge = (size_t)qw->G * N;
        memcpy(qw->codes + e * ce, qw->codes + src * ce, ce);
        memcpy(qw->scales + e * ge, qw->scales + src * ge, ge * sizeof(float));
        if (qw->zeros)
            memcpy(qw->zeros + e * ge, qw->zeros + src * ge, ge);
    }
    return WNA16_OK;
}

/* The layer in the layout: the first `distinct` experts encoded by the
 * reference encoder, the others repeated from them by slices of the
 * stacked tensors (every tensor whose leading dimension is the experts';
 * others must not depend on E). With 128 distinct, the whole layer. */
static wna16_status_t encode(wna16_context_t *ctx, const wna16_spec_t *backend,
                             const wna16_qlayer_t *L, const opts_t *o,
                             const wna16_quant_desc_t *q,
                             wna16_tensor_set_t *out, wna16_error_t *err)
{
    if (o->distinct == E)
        return wna16_ref_encode(ctx, backend, L, "m", out, err);
    wna16_qlayer_t part = *L;
    part.E = part.w13.E = part.w2.E = o->distinct;
    wna16_tensor_decl_t *decls = malloc(sizeof(wna16_tensor_decl_t) *
                                        WNA16_LAYER_MAX_TENSORS);
    size_t count = 0;
    wna16_tensor_set_t *small = NULL;
    wna16_status_t st = decls ? WNA16_OK : WNA16_ENOMEM;
    if (st == WNA16_OK)
        st = wna16_repack_layer_shapes(ctx, backend, "m", E, H, I, q, o->dtype,
                                       WNA16_DTYPE_INVALID, decls, &count, err);
    if (st == WNA16_OK)
        st = wna16_tensor_set_create(ctx, &small, err);
    if (st == WNA16_OK)
        st = wna16_ref_encode(ctx, backend, &part, "m", small, err);
    if (st == WNA16_OK && count != wna16_tensor_set_count(small)) {
        fprintf(stderr, "bench_moe: the %s layout encodes other tensors than "
                "it declares; encoding all %d experts (slow)\n", o->layout, E);
        count = 0; /* decided before anything is added to `out` */
        st = wna16_ref_encode(ctx, backend, L, "m", out, err);
    }
    for (size_t i = 0; st == WNA16_OK && i < count; i++) {
        const wna16_tensor_decl_t *D = &decls[i];
        const wna16_tensor_t *t = wna16_tensor_set_find(small, D->name);
        bool sliced = t && D->ndim >= 1 && t->ndim == D->ndim &&
                      D->shape[0] == E && t->shape[0] == o->distinct;
        bool same = t && t->ndim == D->ndim;
        for (int d = 0; t && d < D->ndim; d++) {
            sliced = sliced && (d == 0 || t->shape[d] == D->shape[d]);
            same = same && t->shape[d] == D->shape[d];
        }
        wna16_tensor_t *d;
        if (!sliced && !same) {
            fprintf(stderr, "bench_moe: %s does not repeat by experts; "
                    "encoding all %d experts (slow)\n", D->name, E);
            wna16_tensor_set_destroy(small);
            free(decls);
            return wna16_ref_encode(ctx, backend, L, "m", out, err);
        }
        st = wna16_tensor_set_add_new(out, t->name, t->dtype, D->ndim, D->shape,
                                      &d, err);
        size_t slice = sliced ? t->nbytes / (size_t)o->distinct : t->nbytes;
        for (int e = 0; st == WNA16_OK && e < (sliced ? E : 1); e++)
            memcpy((unsigned char *)d->data + (size_t)e * slice,
                   (const unsigned char *)t->data + (size_t)(e % o->distinct) * slice,
                   slice);
    }
    wna16_tensor_set_destroy(small);
    free(decls);
    return st;
}

/* The copies the fresh rows rotate through (0 .. C-1) and when each of
 * their experts was last read, on a clock of the weight bytes the fresh
 * calls have read; copy C is the hot rows' own (its reads come from the
 * caches, evict little, and do not advance the clock). */
typedef struct fleet {
    int C;
    wna16_tensor_set_t *sets[MAX_COPIES + 1];
    wna16_moe_layer_t *layers[MAX_COPIES + 1];
    double last[MAX_COPIES][E]; /* clock after the call that read it; -1 never */
    double clock;
    size_t expert_bytes;
} fleet_t;

/* A copy of `src` whose tensors the set owns (the library's bulk
 * allocation: huge pages advised). */
static wna16_status_t copy_set(wna16_context_t *ctx,
                               const wna16_tensor_set_t *src,
                               wna16_tensor_set_t **out, wna16_error_t *err)
{
    wna16_status_t st = wna16_tensor_set_create(ctx, out, err);
    for (size_t i = 0; st == WNA16_OK && i < wna16_tensor_set_count(src); i++) {
        const wna16_tensor_t *t = wna16_tensor_set_at(src, i);
        wna16_tensor_t *d;
        st = wna16_tensor_set_add_new(*out, t->name, t->dtype, t->ndim,
                                      t->shape, &d, err);
        if (st == WNA16_OK)
            memcpy(d->data, t->data, t->nbytes);
    }
    return st;
}

/* A random routing: top-k distinct experts a token, weights normalized. */
static void random_routing(int M, int32_t *ids, float *w)
{
    for (int m = 0; m < M; m++) {
        float sum = 0;
        for (int j = 0; j < TOPK; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(next() % E);
                dup = false;
                for (int jj = 0; jj < j; jj++)
                    dup = dup || ids[m * TOPK + jj] == e;
            } while (dup);
            ids[m * TOPK + j] = e;
            w[m * TOPK + j] = 0.05f + (float)(next() % 1000) * 1e-3f;
            sum += w[m * TOPK + j];
        }
        for (int j = 0; j < TOPK; j++)
            w[m * TOPK + j] /= sum;
    }
}

static int distinct(const int32_t *ids, int n)
{
    bool used[E] = {false};
    int d = 0;
    for (int i = 0; i < n; i++)
        if (!used[ids[i]]) {
            used[ids[i]] = true;
            d++;
        }
    return d;
}

static const double *sort_key;
static int by_last(const void *a, const void *b)
{
    double x = sort_key[*(const int *)a], y = sort_key[*(const int *)b];
    return (x > y) - (x < y);
}

/* Relabels a random routing onto the d experts read least recently of the
 * copy where they were read longest ago (a bijection on expert ids: the
 * same work). Returns the copy; *dist: weight bytes read since the most
 * recent of them was read (INFINITY: none read before). */
static int relabel(fleet_t *f, int32_t *ids, int n, double *dist)
{
    int32_t map[E];
    int seen[E], d = 0;
    for (int e = 0; e < E; e++)
        map[e] = -1;
    for (int i = 0; i < n; i++)
        if (map[ids[i]] < 0) {
            map[ids[i]] = 0;
            seen[d++] = ids[i];
        }
    int best = 0, order[E], best_order[E];
    double best_key = INFINITY;
    for (int c = 0; c < f->C; c++) {
        for (int e = 0; e < E; e++)
            order[e] = e;
        sort_key = f->last[c];
        qsort(order, E, sizeof(int), by_last);
        double key = f->last[c][order[d - 1]];
        if (key < best_key) {
            best_key = key;
            best = c;
            memcpy(best_order, order, sizeof order);
        }
    }
    for (int i = d - 1; i > 0; i--) { /* shuffle the chosen experts */
        int j = (int)(next() % (uint64_t)(i + 1)), t = best_order[i];
        best_order[i] = best_order[j];
        best_order[j] = t;
    }
    for (int i = 0; i < d; i++)
        map[seen[i]] = best_order[i];
    for (int i = 0; i < n; i++)
        ids[i] = map[ids[i]];
    *dist = best_key < 0 ? INFINITY : f->clock - best_key;
    return best;
}

/* Advances the clock by a call's bytes and marks its experts read. */
static void mark_read(fleet_t *f, int c, const int32_t *ids, int n, double bytes)
{
    f->clock += bytes;
    for (int i = 0; i < n; i++)
        f->last[c][ids[i]] = f->clock;
}

/* How many copies the fresh rows need for 2x the LLC between two reads of
 * one expert. A call reads d experts of one copy; while d <= E/2 a copy
 * holds two calls' experts, above it the next call on a copy rereads some
 * of the last one's, so the need depends on the M list and its order: the
 * rounds are simulated (relabel without the kernels, 30 calls a row, two
 * rounds) with more copies until the smallest distance is 2.2x the LLC.
 * The real run prints the distance it saw. */
static int fresh_copies(const opts_t *o, double llc, size_t expert_bytes)
{
    fleet_t *sim = calloc(1, sizeof *sim);
    int32_t *ids = malloc(sizeof(int32_t) * TOPK * 4096);
    float *w = malloc(sizeof(float) * TOPK * 4096);
    int C = 1 + (int)ceil(2.0 * llc / ((double)expert_bytes * E));
    for (C = C < 2 ? 2 : C; sim && ids && w && C < 16; C++) { /* 16: 5 GB */
        *sim = (fleet_t){.C = C, .expert_bytes = expert_bytes};
        for (int c = 0; c < C; c++)
            for (int e = 0; e < E; e++)
                sim->last[c][e] = -1;
        double least = INFINITY;
        for (int round = 0; round < 2; round++)
            for (int k = 0; k < o->nM; k++) {
                int M = o->Ms[round % 2 ? o->nM - 1 - k : k];
                for (int call = 0; call < 30; call++) {
                    double dist;
                    random_routing(M, ids, w);
                    int c = relabel(sim, ids, M * TOPK, &dist);
                    mark_read(sim, c, ids, M * TOPK,
                              (double)distinct(ids, M * TOPK) * (double)expert_bytes);
                    least = dist < least ? dist : least;
                }
            }
        if (least >= 2.2 * llc)
            break;
    }
    free(sim);
    free(ids);
    free(w);
    return C;
}

/* ---- the numeric contract ---------------------------------------------------------- */

/* What a row's kernels compute, for the table's last column: the numeric
 * contract the layer reports (wna16_moe_layer_numerics, fixed when the
 * layer is made), its name and what it means. */
static const char *bench_contract(const wna16_moe_layer_t *layer, int M)
{
    (void)M; /* one contract for every M today */
    switch (wna16_moe_layer_numerics(layer)) {
    case WNA16_NUMERICS_F32:
        return "f32: f32 FMA of dequantized weights";
    case WNA16_NUMERICS_INT8_DYNAMIC:
        return "int8-dynamic: u8 activations (per token) x int4/int8 "
               "codes, int32 sums";
    case WNA16_NUMERICS_BF16_EXACT:
        return "bf16-exact: bf16 weights x bf16 activations, f32 sums";
    default:
        return "unknown";
    }
}

/* ---- the check against the reference ------------------------------------------------ */

/* The size of the terms the tolerance scales with (test_moe_gen.c's
 * slot_mag; no bias, weights on the output, GEMM outputs in float32):
 * mag(n) = sum over the token's slots j of |w_j| sum_i |a_ji W2[e_j][n][i]|,
 * with the activations a computed in double as the reference does. The
 * activations of the token's slots first (token_acts), then mag of the
 * outputs that differ from the reference (token_mag). */
static void token_acts(const wna16_qlayer_t *L, const wna16_moe_params_t *p,
                       const uint16_t *x, const int32_t *ids,
                       double a[TOPK][I])
{
    static double h[2 * I];
    float xf[H];
    for (int k = 0; k < H; k++)
        xf[k] = from_act(p->act_dtype, x[k]);
    for (int j = 0; j < TOPK; j++) {
        for (int n = 0; n < 2 * I; n++) {
            double s = 0;
            for (int k = 0; k < H; k++)
                s += (double)xf[k] * wna16_ref_dequant(&L->w13, ids[j], n, k);
            h[n] = s;
        }
        for (int i = 0; i < I; i++)
            a[j][i] = from_act(p->act_dtype,
                               to_act(p->act_dtype,
                                      wna16_ref_activation(p, (float)h[i],
                                                           (float)h[I + i])));
    }
}

static double token_mag(const wna16_qlayer_t *L, const int32_t *ids,
                        const float *w, double a[TOPK][I], int n)
{
    double mag = 0;
    for (int j = 0; j < TOPK; j++) {
        double m = 0;
        for (int i = 0; i < I; i++)
            m += fabs(a[j][i] * wna16_ref_dequant(&L->w2, ids[j], n, i));
        mag += fabs(w[j]) * m;
    }
    return mag;
}

/* Runs the layer on M tokens and compares up to `want_tokens` of its rows
 * (evenly spread) with wna16_ref_moe_numerics under the contract the layer
 * reports, on the same tokens, within the tests' tolerance: 2 act ulps of
 * the output + 2 eps mag per element, eps widened by 2^-6 under
 * int8-dynamic (a flipped a moves its row's 8-bit code by one; see
 * tests/moe/test_moe_gen.c, check_close). The tests
 * also require 97% of the elements bit-identical, on layers of H, I <=
 * 256; here one activation a_i whose rounding flips (H = 2048 float32
 * products) moves every output of the token a little, and a token has
 * 96-100% of its outputs bit-identical (measured), so the bar is 90%: a
 * missed rounding point still fails it. Returns true when they agree;
 * prints one line either way. *first: the call's seconds (it builds the
 * kernels). */
static bool check_m(const wna16_qlayer_t *L, wna16_moe_layer_t *layer,
                    const wna16_moe_params_t *p, int M, int want_tokens,
                    double *first)
{
    wna16_dtype_t dt = p->act_dtype;
    int nt = M < want_tokens ? M : want_tokens;
    size_t MH = (size_t)M * H;
    uint16_t *x = malloc(sizeof(uint16_t) * MH), *got = malloc(sizeof(uint16_t) * MH);
    uint16_t *xs = malloc(sizeof(uint16_t) * (size_t)nt * H);
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)nt * H);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)M * TOPK);
    int32_t *ids_s = malloc(sizeof(int32_t) * (size_t)nt * TOPK);
    float *w = malloc(sizeof(float) * (size_t)M * TOPK);
    float *w_s = malloc(sizeof(float) * (size_t)nt * TOPK);
    int *rows = malloc(sizeof(int) * (size_t)nt);
    double(*acts)[I] = malloc(sizeof(double) * TOPK * I);
    for (size_t i = 0; i < MH; i++)
        x[i] = to_act(dt, (float)((int)(next() % 2001) - 1000) * 1e-3f);
    random_routing(M, ids, w);
    memset(got, 0xa5, sizeof(uint16_t) * MH); /* every element is written */
    wna16_error_t err;
    double t0 = bench_seconds();
    wna16_status_t st = wna16_moe_layer_run(layer, p, x, M, ids, w, TOPK, got, &err);
    *first = bench_seconds() - t0;
    bool ok = st == WNA16_OK;
    if (!ok)
        fprintf(stderr, "bench_moe: FAIL: M = %d: the layer: %s\n", M, err.message);
    for (int r = 0; r < nt; r++) {
        rows[r] = nt == 1 ? 0 : (int)((int64_t)r * (M - 1) / (nt - 1));
        memcpy(xs + (size_t)r * H, x + (size_t)rows[r] * H, sizeof(uint16_t) * H);
        memcpy(ids_s + r * TOPK, ids + rows[r] * TOPK, sizeof(int32_t) * TOPK);
        memcpy(w_s + r * TOPK, w + rows[r] * TOPK, sizeof(float) * TOPK);
    }
    t0 = bench_seconds();
    wna16_numerics_t nu = wna16_moe_layer_numerics(layer);
    if (ok && wna16_ref_moe_numerics(L, p, nu, xs, nt, ids_s, w_s, TOPK, want,
                                     &err) != WNA16_OK) {
        fprintf(stderr, "bench_moe: FAIL: M = %d: the reference: %s\n", M,
                err.message);
        ok = false;
    }
    long exact = 0, total = 0, bad = 0;
    double worst = 0, eps = (dt == WNA16_DTYPE_F16 ? 0x1p-10 : 0x1p-7) +
                            (nu == WNA16_NUMERICS_INT8_DYNAMIC ? 0x1p-6 : 0.0);
    for (int r = 0; ok && r < nt; r++) {
        const uint16_t *g = got + (size_t)rows[r] * H, *q = want + (size_t)r * H;
        bool have_acts = false;
        for (int n = 0; n < H; n++) {
            double gv = from_act(dt, g[n]), wv = from_act(dt, q[n]);
            total++;
            if (g[n] == q[n] || gv == wv) {
                exact++;
                continue;
            }
            if (!have_acts)
                token_acts(L, p, xs + (size_t)r * H, ids_s + r * TOPK, acts);
            have_acts = true;
            double mag = token_mag(L, ids_s + r * TOPK, w_s + r * TOPK, acts, n);
            double tol = 2.0 * w16_act_ulp(dt, wv) + 2.0 * eps * mag;
            double rel = fabs(gv - wv) / tol;
            if (isnan(rel) || rel > worst)
                worst = isnan(rel) ? INFINITY : rel;
            if (!(fabs(gv - wv) <= tol) && ++bad <= 5)
                fprintf(stderr, "bench_moe: FAIL: M = %d, token %d, element %d: "
                        "got %.8g, reference %.8g (tolerance %.3g)\n", M,
                        rows[r], n, gv, wv, tol);
        }
    }
    double secs = bench_seconds() - t0;
    if (ok && (bad || exact < 0.90 * (double)total)) {
        fprintf(stderr, "bench_moe: FAIL: M = %d: %ld of %ld outputs outside "
                "the tolerance, %ld bit-identical (90%% required)\n", M, bad,
                total, exact);
        ok = false;
    }
    if (ok)
        printf("check M=%-4d %3d of %3d tokens vs the reference (%s): %6ld "
               "outputs, %5.1f%% bit-identical, worst %.2f of the tolerance  "
               "ok  (first call %.0f ms, reference %.1f s)\n", M, nt, M,
               wna16_numerics_name(nu), total,
               100.0 * (double)exact / (double)total, worst, *first * 1e3, secs);
    fflush(stdout);
    free(x);
    free(got);
    free(xs);
    free(want);
    free(ids);
    free(ids_s);
    free(w);
    free(w_s);
    free(rows);
    free(acts);
    return ok;
}

/* ---- the rows ------------------------------------------------------------------------ */

typedef struct row {
    int M;
    bool hot;
    int calls;           /* timed calls a round */
    double *t;           /* every timed call's seconds */
    int n;
    double experts_sum;
    double min_dist;     /* fresh: fewest bytes read between reuses */
    int32_t *ids;        /* routing (hot: fixed; fresh: redrawn every call) */
    float *w;
    uint16_t *x, *out;
} row_t;

/* One call of a row, outside or inside the timing. */
static bool row_call(row_t *r, fleet_t *f, const wna16_moe_params_t *p,
                     bool timed)
{
    int n = r->M * TOPK, c = f->C;
    double dist = INFINITY;
    if (!r->hot) {
        random_routing(r->M, r->ids, r->w);
        c = relabel(f, r->ids, n, &dist);
    }
    int d = distinct(r->ids, n);
    double bytes = (double)d * (double)f->expert_bytes;
    wna16_error_t err;
    double t0 = bench_seconds();
    wna16_status_t st = wna16_moe_layer_run(f->layers[c], p, r->x, r->M, r->ids,
                                            r->w, TOPK, r->out, &err);
    double dt = bench_seconds() - t0;
    if (st != WNA16_OK) {
        fail("M = %d: %s", r->M, err.message);
        return false;
    }
    if (!r->hot)
        mark_read(f, c, r->ids, n, bytes);
    if (timed) {
        r->t[r->n] = dt;
        r->n++;
        r->experts_sum += d;
        if (!r->hot && dist < r->min_dist)
            r->min_dist = dist;
    }
    return true;
}

static void row_print(row_t *r, const fleet_t *f, double stream_best,
                      double llc, wna16_moe_layer_t *layer)
{
    double *t = malloc(sizeof(double) * (size_t)r->n);
    memcpy(t, r->t, sizeof(double) * (size_t)r->n);
    double tm = median(t, r->n), tb = t[0];
    double experts = r->experts_sum / r->n;
    double bytes = experts * (double)f->expert_bytes; /* a call's, mean */
    double gm = bytes / tm / 1e9, gb = bytes / tb / 1e9;
    double flops = 2.0 * r->M * TOPK * (2.0 * I * H + (double)H * I);
    char reuse[16] = "-";
    if (!r->hot && isfinite(r->min_dist))
        snprintf(reuse, sizeof reuse, "%.1fx%s", r->min_dist / llc,
                 r->min_dist < 2 * llc ? "!" : "");
    else if (!r->hot)
        snprintf(reuse, sizeof reuse, "never");
    printf("%5d %-5s %9.3f [%8.3f] %8.1f %7.0f %7.1f %8.1f %7.1f [%5.1f] "
           "%5.0f%% [%4.0f%%] %6s  %s\n", r->M, r->hot ? "hot" : "fresh",
           tm * 1e3, tb * 1e3, flops / tm / 1e9,
           flops / (bytes / (stream_best * 1e9)) / 1e9, experts,
           experts * (double)f->expert_bytes / 1e6, gm, gb,
           100.0 * gm / stream_best, 100.0 * gb / stream_best, reuse,
           bench_contract(layer, r->M));
    free(t);
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc == 2 ? 0 : 1;
    rng ^= o.seed * 0x9e3779b97f4a7c15ull;
    double load0 = load_now();

    wna16_context_options_t copt = {0};
    copt.cpu_threads = o.threads;
    wna16_context_t *ctx;
    wna16_error_t err;
    if (wna16_context_create(&copt, &ctx, &err))
        return fail("%s", err.message);
    w16_cpu_t *cpu;
    if (w16_cpu_get(ctx, &cpu, &err)) {
        printf("SKIP: %s\n", err.message);
        wna16_context_destroy(ctx);
        return 0;
    }
    const wna16_spec_t *backend = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, o.layout);
    if (!backend) {
        fprintf(stderr, "bench_moe: no backend layout '%s'; there are:", o.layout);
        for (size_t i = 0; i < wna16_spec_count(ctx); i++)
            if (wna16_spec_kind(wna16_spec_at(ctx, i)) == WNA16_SPEC_BACKEND)
                fprintf(stderr, " %s", wna16_spec_name(wna16_spec_at(ctx, i)));
        fprintf(stderr, "\n");
        wna16_context_destroy(ctx);
        return 1;
    }
    int threads = w16_cpu_threads(cpu);
    const char *dname = o.dtype == WNA16_DTYPE_F16 ? "f16" : "bf16";
    char gname[16];
    if (o.group < 0)
        snprintf(gname, sizeof gname, "channelwise");
    else
        snprintf(gname, sizeof gname, "g%d", o.group);

    /* 1. the layer in logical form, encoded, copied */
    fprintf(stderr, "bench_moe: encoding a random layer into the %s layout "
            "(reference encoder, %d distinct experts)...\n", o.layout,
            o.distinct);
    double t0 = bench_seconds();
    wna16_qlayer_t L = {.E = E, .H = H, .I = I};
    fleet_t *f = calloc(1, sizeof *f);
    wna16_quant_desc_t q = {.bits = o.bits, .group_size = o.group,
                            .zero_point = o.zero_point, .model_dtype = o.dtype};
    int status = 1;
    stream_t s = {0};
    row_t *rows = NULL;
    int nrows = 2 * o.nM;
    if (operand(&L.w13, 2 * I, H, &o, &err) || operand(&L.w2, H, I, &o, &err) ||
        wna16_tensor_set_create(ctx, &f->sets[0], &err) ||
        encode(ctx, backend, &L, &o, &q, f->sets[0], &err)) {
        fail("%s", err.message);
        goto out;
    }
    double layer_bytes = 0;
    for (size_t i = 0; i < wna16_tensor_set_count(f->sets[0]); i++)
        layer_bytes += (double)wna16_tensor_set_at(f->sets[0], i)->nbytes;
    f->expert_bytes = (size_t)(layer_bytes / E);
    double llc = o.llc_mib > 0 ? o.llc_mib * 1048576.0 : llc_bytes();
    bool llc_assumed = llc <= 0;
    if (llc_assumed)
        llc = 32.0 * 1048576.0;
    f->C = o.copies ? o.copies : fresh_copies(&o, llc, f->expert_bytes);
    if (f->C > MAX_COPIES)
        f->C = MAX_COPIES;
    fprintf(stderr, "bench_moe: encoded in %.1f s; %d more copies of %.0f MB "
            "(%d for the fresh rows, 1 for the hot)...\n", bench_seconds() - t0,
            f->C, layer_bytes / 1e6, f->C);
    for (int c = 1; c <= f->C; c++)
        if (copy_set(ctx, f->sets[0], &f->sets[c], &err)) {
            fail("%s", err.message);
            goto out;
        }
    for (int c = 0; c <= f->C; c++) {
        if (wna16_moe_layer_create(ctx, backend, f->sets[c], "m", E, H, I, &q,
                                   WNA16_TARGET_CPU, &f->layers[c], &err)) {
            fail("%s", err.message);
            goto out;
        }
        for (int e = 0; c < f->C && e < E; e++)
            f->last[c][e] = -1;
    }

    printf("wna16 bench_moe: Qwen3-30B-A3B MoE layer (E=%d H=%d I=%d top-%d, "
           "int%d %s%s, %s activations, silu), %s layout: %.3f MB an expert "
           "(scales and zeros included), %.1f MB the layer; random weights, %d "
           "experts distinct (expert e repeats e mod %d)\n", E, H, I, TOPK,
           o.bits, gname, o.zero_point ? " zero points" : "", dname, o.layout,
           (double)f->expert_bytes / 1e6, layer_bytes / 1e6, o.distinct,
           o.distinct);
    printf("host: CPU %s, %s, %d threads, LLC %.0f MiB (%s), load %.2f at "
           "the start\n", w16_cpu_name(cpu), w16_cpu_compiler_version(),
           threads, llc / 1048576.0,
           o.llc_mib > 0 ? "--llc-mib" : llc_assumed ? "unknown: assumed"
                                                       : "as the CPU reports it",
           load0);
    fflush(stdout);

    /* 2. the check against the reference, every M, before any timing */
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = o.dtype;
    fprintf(stderr, "bench_moe: checking every M against the reference "
            "(scalar; seconds a token)...\n");
    for (int mi = 0; mi < o.nM; mi++) {
        double first;
        if (!check_m(&L, f->layers[0], &p, o.Ms[mi], o.check_tokens, &first)) {
            fail("FAIL: the %s layer's output differs from the reference at "
                 "M = %d; nothing timed", o.layout, o.Ms[mi]);
            goto out;
        }
    }
    wna16_qlayer_free(&L); /* not needed any more: 600 MB of codes */

    /* 3. the baseline's buffer, the rows, an estimate of each row's call */
    size_t sbytes = (size_t)(o.stream_mib * 1048576.0);
    if ((double)sbytes < 2.0 * llc)
        sbytes = (size_t)(2.0 * llc) + PIECE;
    if (!stream_init(&s, sbytes, threads)) {
        fail("out of memory for the %zu MiB baseline buffer", sbytes >> 20);
        goto out;
    }
    rows = calloc((size_t)nrows, sizeof *rows);
    for (int i = 0; i < nrows; i++) {
        row_t *r = &rows[i];
        r->M = o.Ms[i / 2];
        r->hot = i % 2;
        r->min_dist = INFINITY;
        r->ids = malloc(sizeof(int32_t) * (size_t)r->M * TOPK);
        r->w = malloc(sizeof(float) * (size_t)r->M * TOPK);
        r->x = malloc(sizeof(uint16_t) * (size_t)r->M * H);
        r->out = malloc(sizeof(uint16_t) * (size_t)r->M * H);
        for (size_t k = 0; k < (size_t)r->M * H; k++)
            r->x[k] = to_act(o.dtype, (float)((int)(next() % 2001) - 1000) * 1e-3f);
        random_routing(r->M, r->ids, r->w);
        double tw = bench_seconds();
        if (!row_call(r, f, &p, false))
            goto out;
        tw = bench_seconds() - tw;
        r->calls = (int)ceil(o.min_ms * 1e-3 / tw);
        if (r->calls < 3)
            r->calls = 3;
        if (r->calls > 2000)
            r->calls = 2000;
        r->t = malloc(sizeof(double) * (size_t)r->calls * (size_t)o.rounds);
    }

    /* 4. rounds: the baseline, then the rows, forwards and backwards */
    for (int round = 0; round < o.rounds; round++) {
        fprintf(stderr, "bench_moe: round %d of %d (load %.2f)\n", round + 1,
                o.rounds, load_now());
        for (int k = 0; k < o.passes; k++)
            stream_pass(&s);
        for (int k = 0; k < nrows; k++) {
            row_t *r = &rows[round % 2 ? nrows - 1 - k : k];
            if (!row_call(r, f, &p, false)) /* the hot row's weights in cache */
                goto out;
            for (int c = 0; c < r->calls; c++)
                if (!row_call(r, f, &p, true))
                    goto out;
        }
    }

    /* 5. the table */
    double *g = malloc(sizeof(double) * (size_t)s.n);
    memcpy(g, s.gbs, sizeof(double) * (size_t)s.n);
    double smed = median(g, s.n), sbest = g[s.n - 1];
    free(g);
    printf("baseline: streaming read of a %zu MiB buffer with %s on %d "
           "threads (huge pages advised, as the weights'): best %.1f GB/s, "
           "median %.1f, %d passes\n", s.bytes >> 20, isa_name(s.isa),
           threads, sbest, smed, s.n);
    printf("fresh rows: random routing relabelled onto the least recently "
           "read experts of %d copies of the layer (%.0f MB); reuse: the "
           "fewest weight bytes the fresh calls read between two reads of "
           "one expert, in LLCs (! below 2; never: no expert was read "
           "twice); hot rows: one routing on a copy of their own, the same "
           "experts every call (a cache-hot control)\n", f->C,
           f->C * layer_bytes / 1e6);
    printf("%d rounds; each: %d baseline passes, then every row (the order "
           "reversed every other round), an untimed call, then its timed "
           "calls (>= 3, >= %.0f ms); time: median [best] of the calls; "
           "GFLOP/s from the median; bound: the GFLOP/s of reading MB/call "
           "once at the baseline's best; weight GB/s: MB/call / median "
           "[best] time, and %% of the baseline's best\n", o.rounds,
           o.passes, o.min_ms);
    printf("%5s %-5s %20s %8s %7s %7s %8s %15s %14s %6s  %s\n", "M", "row",
           "time ms", "GFLOP/s", "bound", "experts", "MB/call",
           "weight GB/s", "of baseline", "reuse", "contract");
    for (int i = 0; i < nrows; i++)
        row_print(&rows[i], f, sbest, llc, f->layers[0]);
    printf("load %.2f at the end\n", load_now());
    status = 0;

out:
    if (rows)
        for (int i = 0; i < nrows; i++) {
            free(rows[i].t);
            free(rows[i].ids);
            free(rows[i].w);
            free(rows[i].x);
            free(rows[i].out);
        }
    free(rows);
    stream_fini(&s);
    wna16_qlayer_free(&L);
    for (int c = 0; c <= MAX_COPIES; c++) {
        wna16_moe_layer_destroy(f->layers[c]);
        wna16_tensor_set_destroy(f->sets[c]);
    }
    free(f);
    wna16_context_destroy(ctx);
    return status;
}
