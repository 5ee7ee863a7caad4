/*
 * spec_prove.h - proves a bound layout (spec_map.h) at any size from the
 * structure of its maps, visiting a few representative elements instead of
 * all of them (private to spec/; spec_prove.c says how).
 */
#ifndef W16_SPEC_PROVE_H
#define W16_SPEC_PROVE_H

#include "spec/spec_map.h"

/* Proves what w16_bound_walk checks, evaluating at most `budget` elements
 * and places. Returns WNA16_ESPEC with the walk's message when it meets a
 * counterexample; otherwise WNA16_OK with *proved false and *why saying
 * what the structure does not give (the caller walks or probes instead),
 * or *proved true. stats (may be NULL) counts what was evaluated. */
wna16_status_t w16_bound_prove(const w16_bound_t *b, int64_t budget,
                               bool *proved, const char **why,
                               w16_check_stats_t *stats, wna16_error_t *err);

#endif /* W16_SPEC_PROVE_H */
