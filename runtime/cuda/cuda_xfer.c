/*
 * cuda_xfer.c - the pinned ring behind w16_cuda_xfer_upload/download.
 * Each chunk carries an event recorded after the copy that last used it;
 * a chunk is reused only once its event has completed, so at most
 * `chunks` copies are in flight and the host never overwrites bytes the
 * DMA engine has not read yet.
 */
#include "runtime/cuda/cuda_xfer.h"

#include <stdlib.h>
#include <string.h>

typedef struct chunk {
    void *host;
    w16_cuda_event_t *ev;
    bool busy; /* ev was recorded and not yet waited for */
} chunk_t;

struct w16_cuda_xfer {
    w16_cuda_t *cuda;
    chunk_t *chunk;
    int n;
    size_t size;
    int next;
};

void w16_cuda_xfer_destroy(w16_cuda_xfer_t *x)
{
    if (!x)
        return;
    for (int i = 0; i < x->n; i++) {
        if (x->chunk[i].busy)
            w16_cuda_event_sync(x->cuda, x->chunk[i].ev, NULL);
        w16_cuda_event_destroy(x->cuda, x->chunk[i].ev);
        w16_cuda_host_free(x->cuda, x->chunk[i].host);
    }
    free(x->chunk);
    free(x);
}

wna16_status_t w16_cuda_xfer_create(w16_cuda_t *cuda, int chunks,
                                    size_t chunk_bytes, w16_cuda_xfer_t **out,
                                    wna16_error_t *err)
{
    *out = NULL;
    if (chunks <= 0)
        chunks = 4;
    if (!chunk_bytes)
        chunk_bytes = (size_t)4 << 20;
    w16_cuda_xfer_t *x = calloc(1, sizeof *x);
    if (x)
        x->chunk = calloc((size_t)chunks, sizeof *x->chunk);
    if (!x || !x->chunk) {
        free(x);
        return w16_err_nomem(err, "creating a transfer ring");
    }
    x->cuda = cuda;
    x->n = chunks;
    x->size = chunk_bytes;
    wna16_status_t st = WNA16_OK;
    for (int i = 0; i < chunks && st == WNA16_OK; i++) {
        st = w16_cuda_host_alloc(cuda, chunk_bytes, &x->chunk[i].host, err);
        if (st == WNA16_OK)
            st = w16_cuda_event_create(cuda, &x->chunk[i].ev, err);
    }
    if (st != WNA16_OK) {
        w16_cuda_xfer_destroy(x);
        return st;
    }
    *out = x;
    return WNA16_OK;
}

/* The next chunk, once the copy that last used it is done. */
static wna16_status_t take(w16_cuda_xfer_t *x, chunk_t **out,
                           wna16_error_t *err)
{
    chunk_t *c = &x->chunk[x->next];
    x->next = (x->next + 1) % x->n;
    if (c->busy) {
        wna16_status_t st = w16_cuda_event_sync(x->cuda, c->ev, err);
        if (st != WNA16_OK)
            return st;
        c->busy = false;
    }
    *out = c;
    return WNA16_OK;
}

wna16_status_t w16_cuda_xfer_upload(w16_cuda_xfer_t *x, uint64_t dst,
                                    const void *src, size_t n,
                                    w16_cuda_stream_t *stream,
                                    wna16_error_t *err)
{
    const unsigned char *s = src;
    for (size_t off = 0; off < n;) {
        size_t len = n - off < x->size ? n - off : x->size;
        chunk_t *c;
        wna16_status_t st = take(x, &c, err);
        if (st != WNA16_OK)
            return st;
        memcpy(c->host, s + off, len);
        st = w16_cuda_copy_h2d_async(x->cuda, dst + off, c->host, len, stream,
                                     err);
        if (st == WNA16_OK)
            st = w16_cuda_event_record(x->cuda, c->ev, stream, err);
        if (st != WNA16_OK)
            return st;
        c->busy = true;
        off += len;
    }
    return WNA16_OK;
}

wna16_status_t w16_cuda_xfer_download(w16_cuda_xfer_t *x, void *dst,
                                      uint64_t src, size_t n,
                                      w16_cuda_stream_t *stream,
                                      wna16_error_t *err)
{
    /* queue up to n chunks ahead, then drain them in order */
    unsigned char *d = dst;
    size_t queued = 0, drained = 0;
    int first = x->next, inflight = 0;
    wna16_status_t st = WNA16_OK;
    while (drained < n && st == WNA16_OK) {
        if (queued < n && inflight < x->n) {
            size_t len = n - queued < x->size ? n - queued : x->size;
            chunk_t *c;
            st = take(x, &c, err);
            if (st == WNA16_OK)
                st = w16_cuda_copy_d2h_async(x->cuda, c->host, src + queued,
                                             len, stream, err);
            if (st == WNA16_OK)
                st = w16_cuda_event_record(x->cuda, c->ev, stream, err);
            if (st == WNA16_OK) {
                c->busy = true;
                queued += len;
                inflight++;
            }
            continue;
        }
        chunk_t *c = &x->chunk[first];
        first = (first + 1) % x->n;
        size_t len = n - drained < x->size ? n - drained : x->size;
        st = w16_cuda_event_sync(x->cuda, c->ev, err);
        if (st == WNA16_OK) {
            c->busy = false;
            memcpy(d + drained, c->host, len);
            drained += len;
            inflight--;
        }
    }
    return st;
}
