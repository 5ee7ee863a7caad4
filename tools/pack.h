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
#include "gen/moe_cuda.h"
#include "runtime/targets.h"

#define PACK_MAX_ARCHES 8

/* One target of the manifest with the architectures to compile for. */
typedef struct pack_target {
    const w16_target_t *T;
    char arches[PACK_MAX_ARCHES][24];
    int n_arches;
} pack_target_t;

/* REPACK and MOE are kernel IR kernels (gen/build_repack.h,
 * gen/build_moe.h) any target with packs compiles; CUDA_UNIT is a
 * translation unit of the CUDA target's own fused MoE (gen/moe_cuda.h:
 * a template specialized for a GEMM configuration, or a routing piece). */
typedef enum pack_kind { PACK_REPACK, PACK_MOE, PACK_CUDA_UNIT } pack_kind_t;

/* One kernel request of a family on one target (each compiled for every
 * architecture of the target but those in skip_arches). A repack job
 * whose layout keeps block sums also yields the sums kernel unless its
 * codes kernel writes them. */
typedef struct pack_job {
    char family[96];
    const pack_target_t *target;
    pack_kind_t kind;
    w16_repack_request_t repack;
    bool maybe_sums;
    w16_moe_request_t moe;
    w16_moe_stage_t stage;
    /* CUDA_UNIT: a GEMM unit of configuration `cfg`, or (aux) routing
     * piece `piece` of activation dtype `act_dtype` */
    w16_moe_gemm_cfg_t cfg;
    bool aux;
    int piece;
    wna16_dtype_t act_dtype;
    /* bit a: not compiled for target->arches[a] (a wgmma unit runs on
     * sm_90a alone; a unit for sm_90 needs no sm_90a twin) */
    uint32_t skip_arches;
} pack_job_t;

/* The request key of job j (of its codes kernel for a repack): what the
 * runtime looks the kernel up by (gen/request_key.h). */
w16_key_t pack_job_key(const pack_job_t *j);

/* The unit of a CUDA_UNIT job: its readable name (the kernel's, for a
 * GEMM) and its first kernel's (the entry's symbol), and its text
 * (NUL-terminated in b). */
wna16_status_t pack_cuda_unit_source(const pack_job_t *j, char *name,
                                     size_t name_size, char *symbol,
                                     size_t symbol_size, w16_buf_t *b,
                                     wna16_error_t *err);

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
