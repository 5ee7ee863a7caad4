/*
 * targets.h - the list of targets this build has (runtime/targets.c): the
 * one place that names them. Everything above runtime/target/ finds a
 * target here, by id or by name, and then calls through its descriptor.
 */
#ifndef W16_TARGETS_H
#define W16_TARGETS_H

#include "runtime/target/target.h"

/* The targets CMake built, in order of preference for running a job
 * (the first that probes successfully is the default). */
int w16_target_count(void);
const w16_target_t *w16_target_at(int i);

/* The target with this id or name, or NULL when this build has none. */
const w16_target_t *w16_target_find(wna16_target_t id);
const w16_target_t *w16_target_by_name(const char *name);

/* The names of the targets built, "cuda, cpu" ("none" without any), for
 * messages; truncated to fit n bytes. */
void w16_target_names(char *out, size_t n);

/* A target's instance on ctx: EUNAVAILABLE, with the reason, where this
 * build has no such target ("built without CUDA headers") or it cannot run
 * here (the descriptor's probe). *T (may be NULL) receives the target. */
wna16_status_t w16_target_probe(wna16_context_t *ctx, wna16_target_t id,
                                const w16_target_t **T, void **inst,
                                wna16_error_t *err);

/* Releases every target's instance (context teardown). */
void w16_targets_release(wna16_context_t *ctx);

#endif /* W16_TARGETS_H */
