/*
 * cuda_stream.c - the CUDA target's streams (w16_stream_t of
 * runtime/target/target.h): a job's uploads, launches and copies back on
 * three CUDA streams ordered by events. Inputs go up on one stream, kernels
 * run on a second after everything uploaded so far, and an output is
 * copied back on a third while the kernels of the next output run (two
 * "ran" events alternate between consecutive outputs). Every host<->device
 * copy goes through a ring of pinned chunks (cuda_xfer.c). The stream owns
 * every device allocation it makes and frees them at close; an output is
 * freed as soon as it is back on the host, which bounds the device memory
 * of a long job to its inputs and two outputs.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "runtime/cuda/cuda_desc.h"
#include "runtime/cuda/cuda_xfer.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct output {
    uint64_t addr;
    void *host;
    size_t bytes;
} output_t;

struct w16_stream {
    wna16_context_t *ctx;
    w16_cuda_t *cuda;
    w16_cuda_xfer_t *xfer;
    w16_cuda_stream_t *up, *run, *down;
    w16_cuda_event_t *uploaded, *ran[2];
    int which;
    bool uploads_since_launch; /* `run` must wait for `up` before a launch */
    /* device memory this stream made and still holds (inputs, outputs
     * not yet back); outputs also carry where they go */
    uint64_t *allocs;
    int n_allocs, cap_allocs;
    output_t *outputs;
    int n_outputs, cap_outputs;
    /* the output whose kernels were queued last, not yet copied back */
    output_t pending;
    w16_cuda_event_t *pending_ran;
    /* host time per phase (ms) and bytes moved, logged at info level */
    double t_up, t_down, mb_up, mb_down;
    int kernels;
};

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool grow(wna16_context_t *ctx, void **p, int *cap, int n, size_t elem)
{
    if (n < *cap)
        return true;
    int nc = *cap ? 2 * *cap : 16;
    void *q = w16_realloc(ctx, *p, (size_t)*cap * elem, (size_t)nc * elem);
    if (!q)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

/* Device memory the stream keeps until close (or until forget). */
static wna16_status_t alloc_kept(w16_stream_t *s, size_t bytes, uint64_t *addr,
                                 wna16_error_t *err)
{
    if (!grow(s->ctx, (void **)&s->allocs, &s->cap_allocs, s->n_allocs,
              sizeof *s->allocs))
        return w16_err_nomem(err, "tracking device memory");
    wna16_status_t st = w16_cuda_alloc(s->cuda, bytes, addr, err);
    if (st == WNA16_OK && *addr)
        s->allocs[s->n_allocs++] = *addr;
    return st;
}

/* Frees one allocation early (nothing may use it any more). */
static void free_kept(w16_stream_t *s, uint64_t addr)
{
    for (int i = 0; i < s->n_allocs; i++)
        if (s->allocs[i] == addr) {
            s->allocs[i] = s->allocs[--s->n_allocs];
            w16_cuda_free(s->cuda, addr);
            return;
        }
}

wna16_status_t w16_cuda_stream_open(void *inst, wna16_context_t *ctx,
                                    w16_stream_t **out, wna16_error_t *err)
{
    w16_stream_t *s = w16_calloc(ctx, 1, sizeof *s);
    if (!s)
        return w16_err_nomem(err, "opening a CUDA stream");
    s->ctx = ctx;
    s->cuda = inst;
    wna16_status_t st = w16_cuda_xfer_create(s->cuda, 0, 0, &s->xfer, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_create(s->cuda, &s->up, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_create(s->cuda, &s->run, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_create(s->cuda, &s->down, err);
    if (st == WNA16_OK)
        st = w16_cuda_event_create(s->cuda, &s->uploaded, err);
    for (int i = 0; i < 2 && st == WNA16_OK; i++)
        st = w16_cuda_event_create(s->cuda, &s->ran[i], err);
    if (st != WNA16_OK)
        return w16_cuda_stream_close(s, st, NULL);
    *out = s;
    return WNA16_OK;
}

wna16_status_t w16_cuda_stream_put(w16_stream_t *s, const void *host,
                                   size_t bytes, uint64_t *addr,
                                   wna16_error_t *err)
{
    double t0 = ms_now();
    wna16_status_t st = alloc_kept(s, bytes, addr, err);
    if (st == WNA16_OK)
        st = w16_cuda_xfer_upload(s->xfer, *addr, host, bytes, s->up, err);
    s->t_up += ms_now() - t0;
    s->mb_up += (double)bytes / 1e6;
    s->uploads_since_launch = true;
    return st;
}

/* Every buffer in one device allocation (256-byte aligned pieces), then
 * the table of their device addresses. */
wna16_status_t w16_cuda_stream_put_table(w16_stream_t *s, int n,
                                         const uint64_t *hosts,
                                         const size_t *bytes, uint64_t *table,
                                         wna16_error_t *err)
{
    uint64_t *dev = calloc((size_t)(n > 0 ? n : 1), sizeof(uint64_t));
    if (!dev)
        return w16_err_nomem(err, "building a device source table");
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += (bytes[i] + 255) & ~(size_t)255;
    double t0 = ms_now();
    uint64_t base = 0;
    wna16_status_t st = alloc_kept(s, total, &base, err);
    size_t off = 0;
    for (int i = 0; i < n && st == WNA16_OK; i++) {
        dev[i] = base + off;
        st = w16_cuda_xfer_upload(s->xfer, dev[i],
                                  (const void *)(uintptr_t)hosts[i], bytes[i],
                                  s->up, err);
        off += (bytes[i] + 255) & ~(size_t)255;
        s->mb_up += (double)bytes[i] / 1e6;
    }
    s->t_up += ms_now() - t0;
    s->uploads_since_launch = true;
    /* the ring has read `dev` when the upload returns */
    if (st == WNA16_OK)
        st = w16_cuda_stream_put(s, dev, sizeof(uint64_t) * (size_t)n, table,
                                 err);
    free(dev);
    return st;
}

wna16_status_t w16_cuda_stream_output(w16_stream_t *s, void *host,
                                      size_t bytes, uint64_t *addr,
                                      wna16_error_t *err)
{
    if (!grow(s->ctx, (void **)&s->outputs, &s->cap_outputs, s->n_outputs,
              sizeof *s->outputs))
        return w16_err_nomem(err, "tracking an output");
    wna16_status_t st = alloc_kept(s, bytes, addr, err);
    if (st == WNA16_OK)
        s->outputs[s->n_outputs++] = (output_t){*addr, host, bytes};
    return st;
}

/* Copies the pending output back (after its kernels) and frees it. */
static wna16_status_t finish_pending(w16_stream_t *s, wna16_error_t *err)
{
    if (!s->pending.addr)
        return WNA16_OK;
    double t0 = ms_now();
    wna16_status_t st = w16_cuda_stream_wait_event(s->cuda, s->down,
                                                   s->pending_ran, err);
    if (st == WNA16_OK)
        st = w16_cuda_xfer_download(s->xfer, s->pending.host, s->pending.addr,
                                    s->pending.bytes, s->down, err);
    s->t_down += ms_now() - t0;
    s->mb_down += (double)s->pending.bytes / 1e6;
    w16_cuda_stream_sync(s->cuda, s->down, NULL);
    free_kept(s, s->pending.addr);
    s->pending = (output_t){0};
    return st;
}

/* The kernels of this output are queued: copy the previous output back
 * while they run, and leave this one pending. */
wna16_status_t w16_cuda_stream_output_done(w16_stream_t *s, uint64_t addr,
                                           wna16_error_t *err)
{
    output_t o = {0};
    for (int i = 0; i < s->n_outputs; i++)
        if (s->outputs[i].addr == addr) {
            o = s->outputs[i];
            s->outputs[i] = s->outputs[--s->n_outputs];
            break;
        }
    if (!o.addr)
        return w16_err(err, WNA16_EINTERNAL, "CUDA stream: no output at "
                       "0x%llx", (unsigned long long)addr);
    w16_cuda_event_t *ran = s->ran[s->which];
    s->which ^= 1;
    wna16_status_t st = w16_cuda_event_record(s->cuda, ran, s->run, err);
    if (st == WNA16_OK)
        st = finish_pending(s, err);
    if (st != WNA16_OK) {
        w16_cuda_stream_sync(s->cuda, s->run, NULL);
        free_kept(s, o.addr);
        return st;
    }
    s->pending = o;
    s->pending_ran = ran;
    return WNA16_OK;
}

wna16_status_t w16_cuda_stream_launch(w16_stream_t *s, void *fn,
                                      const uint64_t *args, int n_args,
                                      int64_t n_groups, int lanes,
                                      unsigned flags, wna16_error_t *err)
{
    (void)flags; /* the device is always awake */
    if (n_groups > 0x7fffffff)
        return w16_err(err, WNA16_ELIMIT, "%lld workgroups exceed a CUDA "
                       "grid", (long long)n_groups);
    if (n_args > W16_CUDA_MAX_ARGS)
        return w16_err(err, WNA16_ELIMIT, "a kernel of %d parameters (at most "
                       "%d)", n_args, W16_CUDA_MAX_ARGS);
    wna16_status_t st = WNA16_OK;
    if (s->uploads_since_launch) {
        st = w16_cuda_event_record(s->cuda, s->uploaded, s->up, err);
        if (st == WNA16_OK)
            st = w16_cuda_stream_wait_event(s->cuda, s->run, s->uploaded, err);
        s->uploads_since_launch = false;
    }
    if (st != WNA16_OK)
        return st;
    /* cuLaunchKernel reads each parameter's own size from its pointer: a
     * u64 holds an f32 scalar's bits in its low half (little-endian) */
    uint64_t vals[W16_CUDA_MAX_ARGS];
    void *ptrs[W16_CUDA_MAX_ARGS];
    for (int i = 0; i < n_args; i++) {
        vals[i] = args[i];
        ptrs[i] = &vals[i];
    }
    s->kernels++;
    return w16_cuda_launch(s->cuda, w16_cuda_loaded_fn(fn, 0),
                           (unsigned)n_groups, (unsigned)lanes, 0, s->run,
                           ptrs, err);
}

wna16_status_t w16_cuda_stream_close(w16_stream_t *s, wna16_status_t st,
                                     wna16_error_t *err)
{
    if (!s)
        return st;
    if (st == WNA16_OK)
        st = finish_pending(s, err);
    else if (s->pending.addr) /* not copied back: never hand out unwritten memory */
        memset(s->pending.host, 0, s->pending.bytes);
    for (int i = 0; i < s->n_outputs; i++) /* outputs never finished */
        memset(s->outputs[i].host, 0, s->outputs[i].bytes);
    if (st == WNA16_OK && s->kernels)
        wna16_log(s->ctx, WNA16_LOG_INFO, "CUDA stream on %s: %d kernels; "
                  "host time: uploads %.1f ms (%.1f MB), copies back %.1f ms "
                  "(%.1f MB)", w16_cuda_device_name(s->cuda), s->kernels,
                  s->t_up, s->mb_up, s->t_down, s->mb_down);
    /* nothing may still read or write what is freed below */
    w16_cuda_stream_sync(s->cuda, s->up, NULL);
    w16_cuda_stream_sync(s->cuda, s->run, NULL);
    w16_cuda_stream_sync(s->cuda, s->down, NULL);
    for (int i = 0; i < s->n_allocs; i++)
        w16_cuda_free(s->cuda, s->allocs[i]);
    for (int i = 0; i < 2; i++)
        w16_cuda_event_destroy(s->cuda, s->ran[i]);
    w16_cuda_xfer_destroy(s->xfer);
    w16_cuda_event_destroy(s->cuda, s->uploaded);
    w16_cuda_stream_destroy(s->cuda, s->up);
    w16_cuda_stream_destroy(s->cuda, s->run);
    w16_cuda_stream_destroy(s->cuda, s->down);
    w16_free(s->ctx, s->allocs, (size_t)s->cap_allocs * sizeof *s->allocs);
    w16_free(s->ctx, s->outputs, (size_t)s->cap_outputs * sizeof *s->outputs);
    w16_free(s->ctx, s, sizeof *s);
    return st;
}
