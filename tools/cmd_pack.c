/*
 * cmd_pack.c - `wna16 pack`: build an ahead-of-time kernel pack from a
 * manifest (tools/pack_manifest.c expands it into the runtime's kernel
 * requests; every kernel is built, then compiled for each architecture of
 * its target on all cores, and the pack is written once, through a
 * temporary and a rename), and list, verify or extract a pack's entries.
 * The pack format is runtime/cache/pack.h.
 *
 *   manifest -> jobs (requests) -> workers: build IR (or print a CUDA
 *   unit), compile per arch -> items in job order -> w16_pack_write
 */
#define _POSIX_C_SOURCE 200809L
#include "pack.h"
#include "gen/request_key.h"
#include "runtime/cache/pack.h"
#include "runtime/output.h"
#include "runtime/pack.h"
#ifdef WNA16_HAVE_CUDA
#include "runtime/cuda/cuda_desc.h" /* the fused MoE's units */
#endif

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wna16 pack build MANIFEST.json -o NAME.w16pack [-j N] [--quiet]\n"
        "       wna16 pack list PACK [--json]\n"
        "       wna16 pack verify PACK [--json]\n"
        "       wna16 pack extract PACK ENTRY [--target T] [--arch A] -o FILE\n\n"
        "An ahead-of-time kernel pack holds compiled kernels for several\n"
        "targets and architectures in one read-only file that the runtime\n"
        "searches before its kernel cache and the compilers: WNA16_PACK_PATH\n"
        "(colon-separated packs) or wna16_context_add_pack(). With WNA16_JIT=0\n"
        "nothing is compiled at run time: a kernel no pack holds is an error.\n\n"
        "build: expands MANIFEST's kernel families (repack from formats into\n"
        "backends, fused-MoE kernels per backend; see packs/default.json) for\n"
        "its model shapes into the kernels the runtime requests, compiles each\n"
        "for every architecture of its target (cpu: x86-64-v3, x86-64-v4, ...\n"
        "as shared objects linked with ld; cuda: sm_XY CUBINs, compute_XY PTX;\n"
        "a fused-MoE family on cuda gives the tensor-core MoE's units: the\n"
        "GEMMs of every tiling row, wgmma rows for sm_90a only, and the\n"
        "routing pieces)\n"
        "on -j N threads (default: every core), with a progress line on a\n"
        "terminal, and writes one file (a temporary renamed into place). The\n"
        "same manifest with the same compilers gives the same bytes.\n"
        "Configurations the specs refuse are counted and the first is named.\n"
        "list: the pack's header and each entry: name, target, architecture,\n"
        "size, family.\n"
        "verify: every entry's checksum, and that each entry for a target and\n"
        "architecture this machine runs loads; exit 1 on a damaged entry or\n"
        "one that does not load.\n"
        "extract: writes one entry's bytes (a shared object, or the CUDA\n"
        "blob: u64 cubin size, u64 PTX size, CUBIN, PTX) to FILE; ENTRY is\n"
        "its index in 'list' or its kernel name (with --target and --arch\n"
        "where the name has several entries).\n"
        "--json prints one object (list, verify).\n");
}

/* ---- build ----------------------------------------------------------------- */

typedef struct built {
    /* one per architecture, then the sums kernel's (maybe_sums) */
    w16_pack_item_t items[2 * PACK_MAX_ARCHES];
    int n;
    char name[2][192], symbol[2][320];
} built_t;

typedef struct build {
    const pack_manifest_t *m;
    const bool *dup;        /* jobs that repeat an earlier one */
    built_t *out;           /* one per job */
    atomic_size_t next;     /* the next job to take */
    atomic_size_t done_kernels, total_kernels;
    atomic_bool failed;
    pthread_mutex_t mu;     /* err, progress output */
    wna16_error_t err;
    bool progress, tty;
    int last_pct;
    double t0;
} build_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void progress(build_t *B)
{
    if (!B->progress)
        return;
    size_t d = atomic_load(&B->done_kernels), t = atomic_load(&B->total_kernels);
    int pct = t ? (int)(100 * d / t) : 100;
    pthread_mutex_lock(&B->mu);
    if (B->tty) {
        fprintf(stderr, "\rwna16 pack: %zu/%zu kernels compiled (%d%%), "
                "%.1f s", d, t, pct, now_s() - B->t0);
        fflush(stderr);
    } else if (pct / 10 != B->last_pct / 10 || d == t) {
        fprintf(stderr, "wna16 pack: %zu/%zu kernels compiled (%d%%)\n", d, t,
                pct);
        B->last_pct = pct;
    }
    pthread_mutex_unlock(&B->mu);
}

static void build_fail(build_t *B, const wna16_error_t *e, const pack_job_t *j,
                       const char *arch)
{
    pthread_mutex_lock(&B->mu);
    if (!atomic_exchange(&B->failed, true))
        w16_err(&B->err, e->status, "family %s (%s%s%s): %s", j->family,
                j->target->T->name, arch ? " " : "", arch ? arch : "",
                e->message);
    pthread_mutex_unlock(&B->mu);
}

/* The architectures job j is compiled for. */
static int job_arches(const pack_job_t *j)
{
    int n = 0;
    for (int a = 0; a < j->target->n_arches; a++)
        n += !(j->skip_arches >> a & 1u);
    return n;
}

/* Compiles kernel k (request key r) for every architecture of the job's
 * target into out->items[out->n ...]. */
static bool compile_all(build_t *B, wna16_context_t *ctx, const pack_job_t *j,
                        const kir_kernel_t *k, w16_key_t r, built_t *out,
                        int slot)
{
    const pack_target_t *t = j->target;
    snprintf(out->name[slot], sizeof out->name[slot], "%s", k->name);
    w16_target_pack_symbol(t->T, r, k, out->symbol[slot],
                           sizeof out->symbol[slot]);
    for (int a = 0; a < t->n_arches; a++) {
        if (j->skip_arches >> a & 1u)
            continue;
        if (atomic_load(&B->failed))
            return false;
        void *blob = NULL;
        size_t size = 0;
        wna16_error_t e;
        if (t->T->pack_compile(ctx, k, t->arches[a], out->symbol[slot], &blob,
                               &size, &e) != WNA16_OK) {
            build_fail(B, &e, j, t->arches[a]);
            return false;
        }
        out->items[out->n++] = (w16_pack_item_t){
            .request = r, .name = out->name[slot], .symbol = out->symbol[slot],
            .target = t->T->name, .arch = t->arches[a], .family = j->family,
            .data = blob, .size = size};
        atomic_fetch_add(&B->done_kernels, 1);
        progress(B);
    }
    return true;
}

/* A CUDA fused-MoE unit (PACK_CUDA_UNIT) for every architecture of the
 * job: its text printed once, compiled by NVRTC per architecture. */
static void run_cuda_unit(build_t *B, wna16_context_t *ctx,
                          const pack_job_t *j, built_t *out)
{
    wna16_error_t e;
    w16_buf_t src;
    w16_buf_init(&src, ctx);
    if (pack_cuda_unit_source(j, out->name[0], sizeof out->name[0],
                              out->symbol[0], sizeof out->symbol[0], &src,
                              &e) != WNA16_OK) {
        w16_buf_free(&src);
        build_fail(B, &e, j, NULL);
        return;
    }
    const pack_target_t *t = j->target;
    w16_key_t r = pack_job_key(j);
    for (int a = 0; a < t->n_arches && !atomic_load(&B->failed); a++) {
        if (j->skip_arches >> a & 1u)
            continue;
        void *blob = NULL;
        size_t size = 0;
#ifdef WNA16_HAVE_CUDA
        wna16_status_t st = w16_cuda_pack_unit(ctx, src.data, out->name[0],
                                               t->arches[a], &blob, &size,
                                               &e);
#else
        wna16_status_t st = w16_err(&e, WNA16_EUNAVAILABLE, "CUDA unit %s: "
                                    "this build has no cuda target",
                                    out->name[0]);
#endif
        if (st != WNA16_OK) {
            build_fail(B, &e, j, t->arches[a]);
            break;
        }
        out->items[out->n++] = (w16_pack_item_t){
            .request = r, .name = out->name[0], .symbol = out->symbol[0],
            .target = t->T->name, .arch = t->arches[a], .family = j->family,
            .data = blob, .size = size};
        atomic_fetch_add(&B->done_kernels, 1);
        progress(B);
    }
    w16_buf_free(&src);
}

static void run_job(build_t *B, wna16_context_t *ctx, size_t i)
{
    const pack_job_t *j = &B->m->jobs[i];
    built_t *out = &B->out[i];
    wna16_error_t e;
    if (j->kind == PACK_CUDA_UNIT) {
        run_cuda_unit(B, ctx, j, out);
        return;
    }
    if (j->kind == PACK_MOE) {
        w16_moe_kernel_t mk;
        if (w16_build_moe(ctx, &j->moe, j->stage, &mk, &e) != WNA16_OK) {
            build_fail(B, &e, j, NULL);
            return;
        }
        compile_all(B, ctx, j, mk.kernel, w16_moe_request_key(&j->moe, j->stage),
                    out, 0);
        w16_moe_kernel_free(&mk);
        return;
    }
    w16_repack_kernel_t rk;
    if (w16_build_repack(ctx, &j->repack, &rk, &e) != WNA16_OK) {
        build_fail(B, &e, j, NULL);
        return;
    }
    bool ok = compile_all(B, ctx, j, rk.kernel,
                          w16_repack_request_key(&j->repack, false), out, 0);
    bool sums = ok && j->maybe_sums && !rk.sums_fused;
    w16_repack_kernel_free(&rk);
    if (!sums)
        return;
    /* runtime/repack_gen.c runs the block-sums kernel after the codes */
    atomic_fetch_add(&B->total_kernels, (size_t)job_arches(j));
    if (w16_build_repack_sums(ctx, &j->repack, &rk, &e) != WNA16_OK) {
        build_fail(B, &e, j, NULL);
        return;
    }
    compile_all(B, ctx, j, rk.kernel, w16_repack_request_key(&j->repack, true),
                out, 1);
    w16_repack_kernel_free(&rk);
}

/* Jobs whose request repeats an earlier job's on the same target (a
 * qweight kernel reads no scales, so families that differ only in the
 * scale dtype share it): compiled once, under the first family. */
typedef struct job_key {
    w16_key_t key;
    size_t job;
} job_key_t;

static int job_key_cmp(const void *a, const void *b)
{
    const job_key_t *x = a, *y = b;
    if (x->key.hi != y->key.hi)
        return x->key.hi < y->key.hi ? -1 : 1;
    if (x->key.lo != y->key.lo)
        return x->key.lo < y->key.lo ? -1 : 1;
    return x->job < y->job ? -1 : x->job > y->job;
}

/* Marks dup[i] for each repeated job; returns how many, or -1 when out of
 * memory. */
static long mark_duplicates(const pack_manifest_t *m, bool *dup)
{
    job_key_t *k = calloc(m->n_jobs ? m->n_jobs : 1, sizeof *k);
    if (!k)
        return -1;
    for (size_t i = 0; i < m->n_jobs; i++) {
        const pack_job_t *j = &m->jobs[i];
        w16_key_t r = pack_job_key(j);
        w16_key_t t = w16_pack_arch_key(j->target->T->name, "");
        k[i] = (job_key_t){{.lo = r.lo ^ t.lo, .hi = r.hi ^ t.hi}, i};
    }
    qsort(k, m->n_jobs, sizeof *k, job_key_cmp);
    long n = 0;
    for (size_t i = 1; i < m->n_jobs; i++)
        if (k[i].key.hi == k[i - 1].key.hi && k[i].key.lo == k[i - 1].key.lo) {
            dup[k[i].job] = true;
            n++;
        }
    free(k);
    return n;
}

static void *worker(void *arg)
{
    build_t *B = arg;
    /* a context per worker: its allocator and log; the specs the
     * requests point at are the main context's, read only */
    wna16_context_t *ctx = NULL;
    wna16_error_t e;
    wna16_context_options_t o = {.no_builtin_specs = true};
    if (wna16_context_create(&o, &ctx, &e) != WNA16_OK) {
        pthread_mutex_lock(&B->mu);
        if (!atomic_exchange(&B->failed, true))
            B->err = e;
        pthread_mutex_unlock(&B->mu);
        return NULL;
    }
    for (;;) {
        size_t i = atomic_fetch_add(&B->next, 1);
        if (i >= B->m->n_jobs || atomic_load(&B->failed))
            break;
        if (!B->dup[i])
            run_job(B, ctx, i);
    }
    /* the blobs are malloc'd (a context without an allocator option
     * allocates with malloc): they outlive this context, and pack_build
     * frees them with free() */
    wna16_context_destroy(ctx);
    return NULL;
}

static int pack_build(int argc, char **argv)
{
    const char *manifest = NULL, *output = NULL;
    long jobs = 0;
    bool quiet = false;
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        if (cli_opt_value(argc, argv, &i, "-o", &v) ||
            cli_opt_value(argc, argv, &i, "--output", &v)) {
            if (!v)
                return cli_usage_error("pack", "-o needs a file");
            output = v;
        } else if (cli_opt_value(argc, argv, &i, "-j", &v) ||
                   cli_opt_value(argc, argv, &i, "--jobs", &v)) {
            if (!cli_parse_int(v, 1, 1024, &jobs))
                return cli_usage_error("pack", "-j: '%s' is not a number of "
                                       "threads (1 to 1024)", v ? v : "");
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("pack", "unknown option '%s'", argv[i]);
        } else if (!manifest) {
            manifest = argv[i];
        } else {
            return cli_usage_error("pack", "build takes one manifest ('%s' "
                                   "is another)", argv[i]);
        }
    }
    if (!manifest)
        return cli_usage_error("pack", "build needs a MANIFEST.json");
    if (!output)
        return cli_usage_error("pack", "build needs -o NAME.w16pack");
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    pack_manifest_t m;
    wna16_error_t err;
    if (pack_manifest_load(ctx, manifest, &m, &err) != WNA16_OK) {
        wna16_context_destroy(ctx);
        return cli_fail(&err);
    }
    if (!jobs) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n > 0 ? n : 1;
    }
    build_t B = {.m = &m, .progress = !quiet, .tty = isatty(2),
                 .last_pct = -10, .t0 = now_s()};
    pthread_mutex_init(&B.mu, NULL);
    bool *dup = calloc(m.n_jobs ? m.n_jobs : 1, sizeof *dup);
    long n_dup = dup ? mark_duplicates(&m, dup) : -1;
    B.dup = dup;
    size_t total = 0;
    for (size_t i = 0; dup && i < m.n_jobs; i++)
        total += dup[i] ? 0 : (size_t)job_arches(&m.jobs[i]);
    atomic_store(&B.total_kernels, total);
    B.out = calloc(m.n_jobs ? m.n_jobs : 1, sizeof *B.out);
    int rc = CLI_OK;
    if (!B.out || n_dup < 0) {
        rc = cli_fail(&(wna16_error_t){.status = WNA16_ENOMEM,
                                       .message = "out of memory"});
        goto done;
    }
    if (!quiet)
        fprintf(stderr, "wna16 pack: %s: %zu kernel requests over %d "
                "targets (%ld repeated across families), %zu compilations, "
                "%ld threads\n", manifest, m.n_jobs, m.n_targets, n_dup,
                total, jobs);
    pthread_t *th = calloc((size_t)jobs, sizeof *th);
    long started = 0;
    for (; th && started < jobs; started++)
        if (pthread_create(&th[started], NULL, worker, &B) != 0)
            break;
    if (started == 0)
        worker(&B);
    for (long i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    if (B.progress && B.tty)
        fputc('\n', stderr);
    if (atomic_load(&B.failed)) {
        rc = cli_fail(&B.err);
        goto done;
    }
    /* items in job order: the bytes do not depend on which thread
     * finished first */
    size_t n_items = 0;
    for (size_t i = 0; i < m.n_jobs; i++)
        n_items += (size_t)B.out[i].n;
    w16_pack_item_t *items = calloc(n_items ? n_items : 1, sizeof *items);
    if (!items) {
        rc = cli_fail(&(wna16_error_t){.status = WNA16_ENOMEM,
                                       .message = "out of memory"});
        goto done;
    }
    size_t k = 0;
    uint64_t payload = 0;
    for (size_t i = 0; i < m.n_jobs; i++)
        for (int a = 0; a < B.out[i].n; a++) {
            items[k++] = B.out[i].items[a];
            payload += B.out[i].items[a].size;
        }
    /* the compilers recorded in the header, one line per target */
    char compilers[400] = "";
    for (int t = 0; t < m.n_targets; t++)
        snprintf(compilers + strlen(compilers),
                 sizeof compilers - strlen(compilers), "%s%s: %s",
                 t ? "; " : "", m.targets[t].T->name,
                 m.targets[t].T->pack_compiler());
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa = {.sa_handler = w16_output_on_signal,
                                    .sa_flags = SA_RESETHAND};
        sigemptyset(&sa.sa_mask);
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(sigs[i], &sa, NULL);
    }
    uint64_t bytes = 0;
    if (w16_pack_write(ctx, output, m.name, w16_generator_version(), compilers,
                       items, n_items, &bytes, &err) != WNA16_OK) {
        rc = cli_fail(&err);
    } else if (!quiet) {
        fprintf(stderr, "wna16 pack: wrote %s: %zu entries, %llu bytes "
                "(%llu of kernels) in %.1f s\n", output, n_items,
                (unsigned long long)bytes, (unsigned long long)payload,
                now_s() - B.t0);
    }
    if (m.refused)
        fprintf(stderr, "wna16 pack: %zu configuration%s refused by the specs "
                "(not packed); the first: %s\n", m.refused,
                m.refused == 1 ? "" : "s", m.first_refusal);
    free(items);
done:
    for (size_t i = 0; B.out && i < m.n_jobs; i++)
        for (int a = 0; a < B.out[i].n; a++)
            free((void *)B.out[i].items[a].data);
    free(B.out);
    free(dup);
    pthread_mutex_destroy(&B.mu);
    pack_manifest_free(&m);
    wna16_context_destroy(ctx);
    return rc;
}

/* ---- list, verify, extract --------------------------------------------------- */

static int open_pack(const char *path, w16_pack_t **p)
{
    wna16_error_t err;
    if (w16_pack_open(path, p, &err) != WNA16_OK)
        return cli_fail(&err);
    return CLI_OK;
}

static void json_info(FILE *f, const w16_pack_info_t *in)
{
    fputs("\"pack\": ", f);
    cli_json_string(f, in->path);
    fputs(", \"name\": ", f);
    cli_json_string(f, in->name);
    fprintf(f, ", \"format_version\": %u, \"generator\": ", in->format_version);
    cli_json_string(f, in->generator);
    fprintf(f, ", \"generator_matches\": %s, \"compilers\": ",
            strcmp(in->generator, w16_generator_version()) == 0 ? "true"
                                                                : "false");
    cli_json_string(f, in->compilers);
    fprintf(f, ", \"bytes\": %llu, \"entry_count\": %u",
            (unsigned long long)in->file_size, in->entries);
}

static void human_info(const w16_pack_info_t *in)
{
    printf("pack %s (%s): format %u, %u entries, %llu bytes\n", in->path,
           in->name, in->format_version, in->entries,
           (unsigned long long)in->file_size);
    printf("generator: %s%s\ncompilers: %s\n", in->generator,
           strcmp(in->generator, w16_generator_version()) == 0
               ? "" : " (not this library's: its entries are skipped)",
           in->compilers);
}

static int pack_list(const char *path, bool json)
{
    w16_pack_t *p;
    int rc = open_pack(path, &p);
    if (rc != CLI_OK)
        return rc;
    w16_pack_info_t in;
    w16_pack_get_info(p, &in);
    if (json) {
        fputc('{', stdout);
        json_info(stdout, &in);
        fputs(", \"entries\": [", stdout);
    } else {
        human_info(&in);
        printf("%5s  %-6s %-11s %10s  %-24s %s\n", "index", "target", "arch",
               "bytes", "family", "name");
    }
    for (uint32_t i = 0; i < in.entries; i++) {
        w16_pack_entry_t e;
        w16_pack_entry(p, i, &e);
        if (json) {
            char hex[W16_KEY_HEX_SIZE];
            w16_key_hex(e.key, hex);
            printf("%s{\"index\": %u, \"name\": ", i ? ", " : "", i);
            cli_json_string(stdout, e.name);
            fputs(", \"target\": ", stdout);
            cli_json_string(stdout, e.target);
            fputs(", \"arch\": ", stdout);
            cli_json_string(stdout, e.arch);
            fputs(", \"family\": ", stdout);
            cli_json_string(stdout, e.family);
            printf(", \"bytes\": %llu, \"key\": \"%s\"}",
                   (unsigned long long)e.size, hex);
        } else {
            printf("%5u  %-6s %-11s %10llu  %-24s %s\n", i, e.target, e.arch,
                   (unsigned long long)e.size, e.family, e.name);
        }
    }
    if (json)
        fputs("]}\n", stdout);
    w16_pack_close(p);
    return CLI_OK;
}

static int pack_verify(const char *path, bool json)
{
    w16_pack_t *p;
    int rc = open_pack(path, &p);
    if (rc != CLI_OK) {
        if (json)
            cli_json_fail(stdout, cli_last_error());
        return rc;
    }
    wna16_context_t *ctx = cli_context();
    if (!ctx) {
        w16_pack_close(p);
        return CLI_FAIL;
    }
    w16_pack_info_t in;
    w16_pack_get_info(p, &in);
    /* which (target, architecture) pairs run here */
    void *inst[8] = {0};
    const char *arches[8][16];
    int n_arches[8] = {0};
    char why[8][300];
    int nt = w16_target_count() < 8 ? w16_target_count() : 8;
    for (int t = 0; t < nt; t++) {
        const w16_target_t *T = w16_target_at(t);
        wna16_error_t e;
        why[t][0] = 0;
        if (!T->pack_arches)
            snprintf(why[t], sizeof why[t], "%s has no pack entries", T->name);
        else if (T->probe(ctx, &inst[t], &e) != WNA16_OK)
            snprintf(why[t], sizeof why[t], "%s", e.message);
        else
            n_arches[t] = T->pack_arches(inst[t], arches[t], 16);
    }
    uint32_t intact = 0, damaged = 0, loaded = 0, not_here = 0, failed = 0;
    bool gen_ok = strcmp(in.generator, w16_generator_version()) == 0;
    if (json) {
        fputc('{', stdout);
        json_info(stdout, &in);
        fputs(", \"problems\": [", stdout);
    } else {
        human_info(&in);
    }
    int problems = 0;
    for (uint32_t i = 0; i < in.entries; i++) {
        w16_pack_entry_t e;
        w16_pack_entry(p, i, &e);
        char problem[WNA16_ERROR_MESSAGE_MAX + 200] = "";
        if (!w16_pack_entry_intact(p, i)) {
            damaged++;
            snprintf(problem, sizeof problem, "damaged (checksum mismatch)");
        } else {
            intact++;
            int t = -1;
            for (int k = 0; k < nt && t < 0; k++)
                if (strcmp(w16_target_at(k)->name, e.target) == 0)
                    t = k;
            bool here = false;
            for (int a = 0; t >= 0 && a < n_arches[t] && !here; a++)
                here = strcmp(arches[t][a], e.arch) == 0;
            if (!here) {
                not_here++;
            } else {
                const w16_target_t *T = w16_target_at(t);
                void *fn = NULL;
                wna16_error_t le;
                if (T->load(inst[t], e.data, (size_t)e.size, e.symbol, &fn,
                            &le) != WNA16_OK) {
                    failed++;
                    snprintf(problem, sizeof problem, "does not load: %s",
                             le.message);
                } else {
                    loaded++;
                    if (T->unload)
                        T->unload(fn);
                }
            }
        }
        if (!problem[0])
            continue;
        if (json) {
            printf("%s{\"index\": %u, \"name\": ", problems ? ", " : "", i);
            cli_json_string(stdout, e.name);
            fputs(", \"target\": ", stdout);
            cli_json_string(stdout, e.target);
            fputs(", \"arch\": ", stdout);
            cli_json_string(stdout, e.arch);
            fputs(", \"problem\": ", stdout);
            cli_json_string(stdout, problem);
            fputc('}', stdout);
        } else {
            printf("entry %u %s (%s %s): %s\n", i, e.name, e.target, e.arch,
                   problem);
        }
        problems++;
    }
    bool ok = damaged == 0 && failed == 0;
    if (json) {
        printf("], \"intact\": %u, \"damaged\": %u, \"loaded\": %u, "
               "\"load_failed\": %u, \"not_for_this_machine\": %u, "
               "\"ok\": %s}\n", intact, damaged, loaded, failed, not_here,
               ok ? "true" : "false");
    } else {
        printf("%u entries: %u intact, %u damaged; loaded here: %u, failed "
               "to load: %u, for other targets or architectures: %u\n",
               in.entries, intact, damaged, loaded, failed, not_here);
        for (int t = 0; t < nt; t++) {
            bool listed = false; /* only targets the pack has entries for */
            for (uint32_t i = 0; i < in.entries && !listed; i++) {
                w16_pack_entry_t e;
                w16_pack_entry(p, i, &e);
                listed = strcmp(e.target, w16_target_at(t)->name) == 0;
            }
            if (why[t][0] && listed)
                printf("not loaded on %s: %s\n", w16_target_at(t)->name,
                       why[t]);
        }
        if (!gen_ok)
            printf("note: built by generator %s; this library is %s (the "
                   "runtime skips its entries)\n", in.generator,
                   w16_generator_version());
        printf("%s\n", ok ? "ok" : "FAILED");
    }
    wna16_context_destroy(ctx);
    w16_pack_close(p);
    return ok ? CLI_OK : CLI_FAIL;
}

static int pack_extract(int argc, char **argv)
{
    const char *pack = NULL, *entry = NULL, *target = NULL, *arch = NULL,
               *output = NULL;
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        if (cli_opt_value(argc, argv, &i, "-o", &v)) {
            if (!v)
                return cli_usage_error("pack", "-o needs a file");
            output = v;
        } else if (cli_opt_value(argc, argv, &i, "--target", &v)) {
            if (!v)
                return cli_usage_error("pack", "--target needs a name");
            target = v;
        } else if (cli_opt_value(argc, argv, &i, "--arch", &v)) {
            if (!v)
                return cli_usage_error("pack", "--arch needs a name");
            arch = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("pack", "unknown option '%s'", argv[i]);
        } else if (!pack) {
            pack = argv[i];
        } else if (!entry) {
            entry = argv[i];
        } else {
            return cli_usage_error("pack", "extract takes PACK and ENTRY "
                                   "('%s' is more)", argv[i]);
        }
    }
    if (!pack || !entry)
        return cli_usage_error("pack", "extract needs PACK and ENTRY");
    if (!output)
        return cli_usage_error("pack", "extract needs -o FILE");
    w16_pack_t *p;
    int rc = open_pack(pack, &p);
    if (rc != CLI_OK)
        return rc;
    long index = -1;
    uint32_t n = w16_pack_count(p), matches = 0;
    if (cli_parse_int(entry, 0, (long)n - 1, &index)) {
        matches = 1;
    } else {
        index = -1;
        for (uint32_t i = 0; i < n; i++) {
            w16_pack_entry_t e;
            w16_pack_entry(p, i, &e);
            if (strcmp(e.name, entry) == 0 &&
                (!target || strcmp(e.target, target) == 0) &&
                (!arch || strcmp(e.arch, arch) == 0)) {
                if (matches++ == 0)
                    index = i;
            }
        }
    }
    wna16_error_t err;
    if (matches != 1) {
        w16_err(&err, matches ? WNA16_EINVAL : WNA16_ENOTFOUND,
                "%s: %s entry '%s'%s%s%s%s%s", pack,
                matches ? "more than one" : "no", entry,
                target ? " for target " : "", target ? target : "",
                arch ? " arch " : "", arch ? arch : "",
                matches ? " (name --target and --arch; see 'wna16 pack list')"
                        : "");
        w16_pack_close(p);
        return cli_fail(&err);
    }
    w16_pack_entry_t e;
    w16_pack_entry(p, (uint32_t)index, &e);
    if (!w16_pack_entry_intact(p, (uint32_t)index)) {
        w16_err(&err, WNA16_EFORMAT, "%s: entry %ld %s (%s %s) is damaged "
                "(checksum mismatch)", pack, index, e.name, e.target, e.arch);
        w16_pack_close(p);
        return cli_fail(&err);
    }
    wna16_context_t *ctx = cli_context();
    if (!ctx) {
        w16_pack_close(p);
        return CLI_FAIL;
    }
    w16_arena_t arena;
    w16_arena_init(&arena, ctx);
    w16_output_t o = {.fd = -1, .slot = -1};
    wna16_status_t st = w16_output_open(ctx, &arena, output, &o, &err);
    const char *b = e.data;
    for (size_t done = 0; st == WNA16_OK && done < e.size;) {
        ssize_t w = write(o.fd, b + done, (size_t)e.size - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            st = w16_err(&err, WNA16_EIO, "%s: %s", w16_output_name(&o),
                         w < 0 ? strerror(errno) : "nothing written");
        else
            done += (size_t)w;
    }
    if (st == WNA16_OK)
        st = w16_output_commit(&o, &err);
    else
        w16_output_discard(&o);
    w16_arena_free(&arena);
    wna16_context_destroy(ctx);
    if (st == WNA16_OK)
        fprintf(stderr, "wna16 pack: entry %ld %s (%s %s, %llu bytes) -> %s\n",
                index, e.name, e.target, e.arch, (unsigned long long)e.size,
                output);
    w16_pack_close(p);
    return st == WNA16_OK ? CLI_OK : cli_fail(&err);
}

int cmd_pack(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "build") == 0)
        return pack_build(argc, argv);
    if (strcmp(sub, "extract") == 0)
        return pack_extract(argc, argv);
    if (strcmp(sub, "list") == 0 || strcmp(sub, "verify") == 0) {
        const char *path = NULL;
        bool json = false;
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--json") == 0)
                json = true;
            else if (argv[i][0] == '-' && argv[i][1])
                return cli_usage_error("pack", "unknown option '%s'", argv[i]);
            else if (!path)
                path = argv[i];
            else
                return cli_usage_error("pack", "%s takes one PACK ('%s' is "
                                       "another)", sub, argv[i]);
        }
        if (!path)
            return cli_usage_error("pack", "%s needs a PACK", sub);
        if (sub[0] == 'l') {
            if (json) {
                w16_pack_t *p;
                wna16_error_t err;
                if (w16_pack_open(path, &p, &err) != WNA16_OK) {
                    fprintf(stderr, "wna16: %s\n", err.message);
                    return cli_json_fail(stdout, &err);
                }
                w16_pack_close(p);
            }
            return pack_list(path, json);
        }
        return pack_verify(path, json);
    }
    return cli_usage_error("pack", "unknown subcommand '%s' (build, list, "
                           "verify, extract)", sub);
}
