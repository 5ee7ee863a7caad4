/*
 * pack.h - `wna16 pack`'s pieces shared by its files: the manifest
 * (tools/pack_manifest.c: a JSON file of targets with their architectures,
 * model shapes and kernel families, read strictly, every error naming the
 * JSON path) expanded into the kernel requests the runtime makes, and the
 * commands (tools/cmd_pack.c).
 */
#ifndef WNA16_TOOLS_PACK_H
#define WNA16_TOOLS_PACK_H

#include "cli.h"
#include "gen/build_moe.h"
#include "gen/build_repack.h"
#include "runtime/targets.h"

#define PACK_MAX_ARCHES 8

/* One target of the manifest with the architectures to compile for. */
typedef struct pack_target {
    const w16_target_t *T;
    char arches[PACK_MAX_ARCHES][24];
    int n_arches;
} pack_target_t;

typedef enum pack_kind { PACK_REPACK, PACK_MOE } pack_kind_t;

/* One kernel request of a family on one target (each compiled for every
 * architecture of the target). A repack job whose layout keeps block
 * sums also yields the sums kernel unless its codes kernel writes them. */
typedef struct pack_job {
    char family[96];
    const pack_target_t *target;
    pack_kind_t kind;
    w16_repack_request_t repack;
    bool maybe_sums;
    w16_moe_request_t moe;
    w16_moe_stage_t stage;
} pack_job_t;

typedef struct pack_manifest {
    char name[96];
    pack_target_t targets[8];
    int n_targets;
    pack_job_t *jobs; /* malloc'd */
    size_t n_jobs, cap_jobs;
    /* configurations the specs refuse (not packed), with the first reason */
    size_t refused;
    char first_refusal[600];
} pack_manifest_t;

/* Reads and expands MANIFEST. The specs named are ctx's (the requests
 * point at them: ctx must outlive the manifest). Errors: the file and JSON
 * path (WNA16_ESPEC), unknown targets, architectures or specs named at
 * their path. */
wna16_status_t pack_manifest_load(wna16_context_t *ctx, const char *path,
                                  pack_manifest_t *out, wna16_error_t *err);
void pack_manifest_free(pack_manifest_t *m);


#endif
