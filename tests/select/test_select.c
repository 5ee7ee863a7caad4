/*
 * test_select.c - table-driven tests of wna16_select against the built-in
 * specs: one row per deployment with the backend expected (or the failure
 * status and message) and the exact reason of each backend passed over.
 * The rows cover every format "errors" rule, both fallbacks, every gate and
 * kernel-class reason that the built-in specs can produce, both wna16
 * capability reasons, explicit requests (accepted, refused and never
 * replaced, unknown names), every platform, the Marlin shape rules with and
 * without tile padding, the golden checkpoints and the facts-sheet (section
 * 3) examples, and query validation. Every row passes an explicit kernel
 * mask so results do not depend on the build.
 */
#include "select_test.h"

#include <string.h>

#define FI "flashinfer_trtllm"
#define MA "marlin"
#define BM "batched_marlin"
#define TR "triton"
#define HU "humming"
#define EM "emulation"
#define CT "compressed_tensors"
#define MW "moe_wna16"

#define R_ZPB "zero points and bias are not supported"
#define R_MOE "the MoeWNA16 checkpoint layout is not supported"
#define R_MARLIN "Marlin not supported for this layer"
#define R_BIAS "expert bias is not supported"
#define R_GROUP "group activation ordering is not supported"
#define R_STD "kernel does not support standard activation format"
#define R_BAT "kernel does not support batched activation format"
#define R_DEV(d) "kernel does not support current device " d
#define R_SCHEME(s) "kernel does not support quantization scheme " s
#define R_ACT(a) "kernel does not support " a " activation"
#define R_NOBUILD(p) "this wna16 build has no " p " kernel target"
#define R_NOGEN(p) "wna16 generates no " p " kernels for this backend"
#define SM(x) "cuda with compute capability " x
#define MI300 "rocm with compute capability 9.4"

#define NONE_FITS "No WNA16 MoE backend supports the deployment configuration."
#define FALLBACK "format 'gptq' falls back to 'moe_wna16': " \
    "check_moe_marlin_supports_layer failed, so vLLM loads the layer " \
    "through MoeWNA16"
#define AWQ_FALLBACK "format 'awq' falls back to 'moe_wna16'"
#define REFUSED(b, r) "WNA16 MoE backend '" b "' does not support the " \
    "deployment configuration since " r "."

#define UNSUP .st = WNA16_EUNSUPPORTED
#define INVAL .st = WNA16_EINVAL
#define ROCM .plat = WNA16_PLATFORM_ROCM, .cc = 94
#define ON_CPU .plat = WNA16_PLATFORM_CPU
#define ON_XPU .plat = WNA16_PLATFORM_XPU

/* ---- the format stage: integration errors and fallbacks ----------------- */

static const st_row_t format_rows[] = {
    {"gptq_zero_point_rejected", .fmt = "gptq", .zp = 1, UNSUP, .exact = 1,
     .err = "AutoGPTQ: vLLM's AutoGPTQ MoE integration accepts only "
            "symmetric 4- or 8-bit checkpoints (uint4b8, uint8b128)"},
    {"awq_8bit_rejected", .fmt = "awq", .bits = 8, .zp = 1, UNSUP,
     .exact = 1,
     .err = "AutoAWQ: vLLM's AutoAWQ MoE integration is 4-bit only"},
    {"ct_8bit_grouped_rejected", .fmt = CT, .bits = 8, UNSUP, .exact = 1,
     .err = "compressed-tensors (QuantizationArgs): compressed-tensors "
            "8-bit MoE asserts channelwise quantization (group_size -1)"},
    {"moe_wna16_8bit_grouped_rejected", .fmt = MW, .bits = 8, UNSUP,
     .exact = 1,
     .err = "MoeWNA16: MoeWNA16 8-bit asserts channelwise quantization "
            "(group_size -1)"},
    /* The fallback's own errors are checked after the switch. */
    {"gptq_8bit_rocm_fallback_rejected", .fmt = "gptq", .bits = 8, ROCM,
     .km = ST_KM_ALL, UNSUP, .note = FALLBACK, .eff_fmt = MW, .exact = 1,
     .err = "MoeWNA16: MoeWNA16 8-bit asserts channelwise"},
    {"gptq_h192_falls_back", .fmt = "gptq", .H = 192, .want = TR,
     .note = FALLBACK, .eff_fmt = MW, .exact = 1,
     .po = {{FI, R_DEV(SM("9.0"))}, {MA, R_MOE}, {BM, R_MOE}}},
    {"gptq_gs256_falls_back", .fmt = "gptq", .gs = 256, .want = TR,
     .note = FALLBACK, .eff_fmt = MW},
    /* Facts sheet / golden README: AWQ gs=64, I=96 fails the Marlin gate
     * and vLLM falls back to MoeWNA16. */
    {"awq_g64_i96_falls_back", .fmt = "awq", .zp = 1, .gs = 64, .H = 128,
     .I = 96, .want = TR, .note = AWQ_FALLBACK, .eff_fmt = MW, .exact = 1,
     .po = {{FI, R_ZPB}, {MA, R_MOE}, {BM, R_MOE}}},
    /* Act-order forbids tile padding: I=96 is not a multiple of 64. */
    {"gptq_gsm1_i96_actorder_falls_back", .fmt = "gptq", .gs = -1,
     .ao = 1, .H = 128, .I = 96, .want = TR, .note = FALLBACK,
     .eff_fmt = MW},
    {"gptq_rocm_falls_back_nothing_fits", .fmt = "gptq", ROCM,
     .km = ST_KM_ALL, UNSUP, .err = NONE_FITS, .note = FALLBACK,
     .eff_fmt = MW, .exact = 1,
     .po = {{FI, R_DEV(MI300)}, {MA, R_MOE}, {BM, R_MOE},
            {TR, R_NOGEN("rocm")}, {HU, R_DEV(MI300)}, {EM, R_MOE}}},
};

/* ---- golden checkpoints (../shared/golden) and facts-sheet examples ----- */

static const st_row_t golden_rows[] = {
    {"golden_gptq_b4_g128", .fmt = "gptq", .want = MA, .exact = 1,
     .po = {{FI, R_ZPB}}},
    {"golden_gptq_b4_gm1", .fmt = "gptq", .gs = -1, .H = 128, .I = 64,
     .want = MA, .exact = 1, .po = {{FI, R_ZPB}}},
    {"golden_gptq_b8_g128", .fmt = "gptq", .bits = 8, .want = MA,
     .exact = 1, .po = {{FI, R_ZPB}}},
    {"golden_gptq_b4_g128_actorder", .fmt = "gptq", .ao = 1, .want = MA},
    {"golden_awq_b4_g128", .fmt = "awq", .zp = 1, .want = MA, .exact = 1,
     .po = {{FI, R_ZPB}}},
    {"golden_gptq_b4_g32_pad", .fmt = "gptq", .gs = 32, .H = 128, .I = 160,
     .want = MA},
    {"golden_gptq_b4_gm1_pad", .fmt = "gptq", .gs = -1, .H = 128, .I = 96,
     .want = MA},
    {"golden_awq_b4_g32_pad", .fmt = "awq", .zp = 1, .gs = 32, .H = 128,
     .I = 96, .want = MA},
};

/* ---- FLASHINFER_TRTLLM ---------------------------------------------------- */

static const st_row_t flashinfer_rows[] = {
    {"ct_sm100_g32_flashinfer", .fmt = CT, .gs = 32, .cc = 100, .want = FI,
     .exact = 1},
    {"ct_sm100_g32_asym_gate", .fmt = CT, .gs = 32, .zp = 1, .cc = 100,
     .want = MA, .exact = 1, .po = {{FI, R_ZPB}}},
    {"ct_sm100_g32_bias_gate", .fmt = CT, .gs = 32, .bias = 1, .cc = 100,
     .want = MA, .exact = 1, .po = {{FI, R_ZPB}}},
    {"ct_sm90_flashinfer_device", .fmt = CT, .want = MA, .exact = 1,
     .po = {{FI, R_DEV(SM("9.0"))}}},
    {"ct_sm120_flashinfer_device", .fmt = CT, .gs = 32, .cc = 120,
     .want = MA, .exact = 1, .po = {{FI, R_DEV(SM("12.0"))}}},
    {"ct_sm100_g128_flashinfer_scheme", .fmt = CT, .cc = 100, .want = MA,
     .exact = 1, .po = {{FI, R_SCHEME("kInt4Static")}}},
    {"ct_sm100_8bit_flashinfer_scheme", .fmt = CT, .bits = 8, .gs = -1,
     .cc = 100, .want = MA, .exact = 1, .po = {{FI, R_SCHEME("kInt8Static")}}},
    {"ct_sm100_gelu_flashinfer_activation", .fmt = CT, .gs = 32, .cc = 100,
     .act = "gelu", .want = MA, .exact = 1, .po = {{FI, R_ACT("gelu")}}},
    {"ct_sm100_swigluoai_flashinfer", .fmt = CT, .gs = 32, .cc = 100,
     .act = "swigluoai", .want = FI},
    {"ct_sm100_batched_batched_marlin", .fmt = CT, .gs = 32, .cc = 100,
     .batched = 1, .want = BM, .exact = 1,
     .po = {{FI, R_BAT}, {MA, R_BAT}}},
};

/* ---- MARLIN / BATCHED_MARLIN ----------------------------------------------- */

static const st_row_t marlin_rows[] = {
    {"moe_wna16_marlin_gate", .fmt = MW, .want = TR, .exact = 1,
     .po = {{FI, R_DEV(SM("9.0"))}, {MA, R_MOE}, {BM, R_MOE}}},
    {"ct_h192_marlin_layer", .fmt = CT, .H = 192, .want = TR, .exact = 1,
     .po = {{FI, R_DEV(SM("9.0"))}, {MA, R_MARLIN}, {BM, R_MARLIN}}},
    {"ct_gs256_marlin_layer", .fmt = CT, .gs = 256, .want = TR,
     .po = {{MA, R_MARLIN}, {BM, R_MARLIN}}},
    {"ct_sm70_marlin_device", .fmt = CT, .cc = 70, .want = TR, .exact = 1,
     .po = {{FI, R_DEV(SM("7.0"))}, {MA, R_DEV(SM("7.0"))},
            {BM, R_DEV(SM("7.0"))}}},
    {"ct_sm75_marlin", .fmt = CT, .cc = 75, .want = MA},
    {"ct_8bit_asym_nothing_fits", .fmt = CT, .bits = 8, .gs = -1, .zp = 1,
     UNSUP, .err = NONE_FITS, .exact = 1,
     .po = {{FI, R_ZPB}, {MA, R_SCHEME("kInt8StaticAsym")},
            {BM, R_SCHEME("kInt8StaticAsym")},
            {TR, R_SCHEME("kInt8StaticAsym")},
            {HU, R_SCHEME("kInt8StaticAsym")},
            {EM, R_SCHEME("kInt8StaticAsym")}}},
    {"ct_gelu_tanh_marlin_activation", .fmt = CT, .act = "gelu_tanh",
     .want = TR, .exact = 1,
     .po = {{FI, R_DEV(SM("9.0"))}, {MA, R_ACT("gelu_tanh")},
            {BM, R_ACT("gelu_tanh")}}},
    {"ct_relu2_no_mul_marlin", .fmt = CT, .act = "relu2_no_mul", .want = MA},
    {"ct_8bit_channelwise_marlin", .fmt = CT, .bits = 8, .gs = -1,
     .want = MA},
    {"ct_asym_marlin", .fmt = CT, .zp = 1, .want = MA, .exact = 1,
     .po = {{FI, R_ZPB}}},
    /* Batched activations: only BATCHED_MARLIN (and HUMMING) take them. */
    {"gptq_batched_batched_marlin", .fmt = "gptq", .batched = 1, .want = BM,
     .exact = 1, .po = {{FI, R_ZPB}, {MA, R_BAT}}},
    /* BATCHED_MARLIN's own "standard format" reason surfaces once MARLIN is
     * out for a reason BATCHED_MARLIN does not share. */
    {"gptq_no_cuda_target", .fmt = "gptq", .km = ST_BIT(CPU), UNSUP,
     .err = NONE_FITS, .exact = 1,
     .po = {{FI, R_ZPB}, {MA, R_NOBUILD("cuda")}, {BM, R_STD},
            {TR, R_BIAS}, {HU, R_NOBUILD("cuda")}, {EM, R_NOBUILD("cuda")}}},
};

/* ---- check_moe_marlin_supports_config: H and the intermediate size ------- */

static const st_row_t shape_rows[] = {
    /* padding allowed (no act-order): gs <= 0 or I % gs == 0 */
    {"ct_gsm1_i96_padding", .fmt = CT, .gs = -1, .H = 128, .I = 96,
     .want = MA},
    {"ct_g32_i96_padding", .fmt = CT, .gs = 32, .H = 128, .I = 96,
     .want = MA},
    {"ct_g64_i96_padding_still_fails", .fmt = CT, .gs = 64, .H = 128,
     .I = 96, .want = TR, .po = {{MA, R_MARLIN}, {BM, R_MARLIN}}},
    {"ct_g128_i64_fails", .fmt = CT, .gs = 128, .H = 128, .I = 64,
     .want = TR, .po = {{MA, R_MARLIN}}},
    /* no padding (act-order): I % max(64, gs) == 0 */
    {"ct_g32_i96_actorder_no_padding", .fmt = CT, .gs = 32, .H = 128,
     .I = 96, .ao = 1, .actorder = "group", .want = EM, .exact = 1,
     .po = {{FI, R_DEV(SM("9.0"))}, {MA, R_MARLIN}, {BM, R_MARLIN},
            {TR, R_GROUP}, {HU, R_SCHEME("kInt4Static32")}}},
    {"ct_g32_i128_actorder_ok", .fmt = CT, .gs = 32, .H = 128, .I = 128,
     .ao = 1, .actorder = "group", .want = MA},
    /* H % 128 != 0 */
    {"ct_h320_marlin_layer", .fmt = CT, .H = 320, .want = TR,
     .po = {{MA, R_MARLIN}}},
    {"ct_h384_marlin", .fmt = CT, .H = 384, .want = MA},
};

/* ---- TRITON ---------------------------------------------------------------------- */

static const st_row_t triton_rows[] = {
    {"ct_bias_h192_triton_bias", .fmt = CT, .bias = 1, .H = 192, .want = HU,
     .exact = 1,
     .po = {{FI, R_ZPB}, {MA, R_MARLIN}, {BM, R_MARLIN}, {TR, R_BIAS}}},
    {"ct_actorder_group_h192", .fmt = CT, .ao = 1, .actorder = "group",
     .H = 192, .want = HU, .po = {{TR, R_GROUP}}},
    {"ct_actorder_weight_h192", .fmt = CT, .actorder = "weight", .H = 192,
     .want = TR},
    {"ct_actorder_dynamic_h192", .fmt = CT, .ao = 1, .actorder = "dynamic",
     .H = 192, .want = TR},
    {"ct_actorder_null_never_matches", .fmt = CT, .ao = 1, .H = 192,
     .want = TR},
    {"ct_asym_h192_emulation", .fmt = CT, .zp = 1, .H = 192, .want = EM,
     .exact = 1,
     .po = {{FI, R_ZPB}, {MA, R_MARLIN}, {BM, R_MARLIN},
            {TR, R_SCHEME("kInt4StaticAsym")},
            {HU, R_SCHEME("kInt4StaticAsym")}}},
    {"ct_asym_g32_h192_emulation", .fmt = CT, .zp = 1, .gs = 32, .H = 192,
     .want = EM, .po = {{TR, R_SCHEME("kInt4Static32Asym")},
                        {HU, R_SCHEME("kInt4Static32Asym")}}},
    {"ct_8bit_h192_triton", .fmt = CT, .bits = 8, .gs = -1, .H = 192,
     .want = TR},
    {"explicit_triton_cpu", .fmt = CT, ON_CPU, .backend = TR, UNSUP,
     .err = REFUSED("TRITON", R_DEV("cpu")), .exact = 1,
     .po = {{TR, R_DEV("cpu")}}},
    {"explicit_triton_batched", .fmt = CT, .batched = 1, .backend = TR,
     UNSUP, .err = REFUSED("TRITON", R_BAT), .exact = 1,
     .po = {{TR, R_BAT}}},
    /* vLLM checks bias before the layout: GPTQ and AWQ always may carry it */
    {"explicit_triton_gptq_actorder", .fmt = "gptq", .ao = 1, .backend = TR,
     UNSUP, .exact = 1, .po = {{TR, R_BIAS}}},
    {"explicit_triton_awq", .fmt = "awq", .zp = 1, .backend = TR, UNSUP,
     .exact = 1, .po = {{TR, R_BIAS}}},
    {"explicit_triton_ct_group", .fmt = CT, .ao = 1, .actorder = "group",
     .backend = TR, UNSUP, .err = REFUSED("TRITON", R_GROUP), .exact = 1,
     .po = {{TR, R_GROUP}}},
    {"explicit_triton_ct", .fmt = CT, .backend = TR, .want = TR,
     .exact = 1},
    /* XPU's list holds only XPU, but TRITON may be requested there. */
    {"explicit_triton_xpu", .fmt = CT, ON_XPU, .backend = TR, .want = TR,
     .exact = 1},
    {"explicit_triton_rocm", .fmt = CT, ROCM, .km = ST_KM_ALL, .backend = TR,
     UNSUP, .err = REFUSED("TRITON", R_NOGEN("rocm")), .exact = 1,
     .po = {{TR, R_NOGEN("rocm")}}},
};

/* ---- HUMMING and EMULATION ----------------------------------------------------- */

static const st_row_t humming_emulation_rows[] = {
    {"explicit_humming", .fmt = "gptq", .backend = HU, .want = HU,
     .exact = 1},
    {"explicit_humming_batched", .fmt = "gptq", .batched = 1, .backend = HU,
     .want = HU},
    {"explicit_humming_awq", .fmt = "awq", .zp = 1, .backend = HU,
     .want = HU},
    {"explicit_humming_sm70", .fmt = "gptq", .cc = 70, .backend = HU, UNSUP,
     .err = REFUSED("HUMMING", R_DEV(SM("7.0"))), .exact = 1,
     .po = {{HU, R_DEV(SM("7.0"))}}},
    {"explicit_humming_g32", .fmt = CT, .gs = 32, .backend = HU, UNSUP,
     .exact = 1, .po = {{HU, R_SCHEME("kInt4Static32")}}},
    {"explicit_emulation", .fmt = "awq", .zp = 1, .backend = EM, .want = EM,
     .exact = 1},
    {"explicit_emulation_moe_wna16", .fmt = MW, .backend = EM, UNSUP,
     .err = REFUSED("EMULATION", R_MOE), .exact = 1, .po = {{EM, R_MOE}}},
    {"explicit_emulation_int4_only", .fmt = "gptq", .bits = 8, .backend = EM,
     UNSUP, .err = REFUSED("EMULATION", R_SCHEME("kInt8Static")),
     .exact = 1, .po = {{EM, R_SCHEME("kInt8Static")}}},
    {"explicit_emulation_batched", .fmt = "gptq", .batched = 1,
     .backend = EM, UNSUP, .exact = 1, .po = {{EM, R_BAT}}},
    {"explicit_emulation_xpu", .fmt = "gptq", ON_XPU, .backend = EM, UNSUP,
     .exact = 1, .po = {{EM, R_DEV("xpu")}}},
    {"explicit_emulation_rocm", .fmt = CT, ROCM, .km = ST_KM_ALL,
     .backend = EM, UNSUP, .exact = 1, .po = {{EM, R_NOGEN("rocm")}}},
};

/* ---- CPU, XPU and ROCm -------------------------------------------------------- */

static const st_row_t platform_rows[] = {
    {"cpu_gptq", .fmt = "gptq", ON_CPU, .want = "cpu", .exact = 1},
    {"cpu_awq", .fmt = "awq", .zp = 1, ON_CPU, .want = "cpu", .exact = 1},
    {"cpu_ct", .fmt = CT, ON_CPU, .act = "silu", .want = "cpu"},
    {"cpu_8bit", .fmt = "gptq", .bits = 8, ON_CPU, UNSUP, .err = NONE_FITS,
     .exact = 1, .po = {{"cpu", R_SCHEME("kInt8Static")}}},
    {"cpu_ct_g32", .fmt = CT, .gs = 32, ON_CPU, UNSUP, .exact = 1,
     .po = {{"cpu", R_SCHEME("kInt4Static32")}}},
    {"cpu_ct_asym", .fmt = CT, .zp = 1, ON_CPU, UNSUP, .exact = 1,
     .po = {{"cpu", R_SCHEME("kInt4StaticAsym")}}},
    {"cpu_gelu", .fmt = "gptq", .act = "gelu", ON_CPU, UNSUP, .exact = 1,
     .po = {{"cpu", R_ACT("gelu")}}},
    {"cpu_batched", .fmt = "gptq", .batched = 1, ON_CPU, UNSUP, .exact = 1,
     .po = {{"cpu", R_BAT}}},
    {"cpu_no_cpu_target", .fmt = "gptq", ON_CPU, .km = ST_BIT(CUDA), UNSUP,
     .err = NONE_FITS, .exact = 1, .po = {{"cpu", R_NOBUILD("cpu")}}},
    {"explicit_marlin_on_cpu", .fmt = "gptq", ON_CPU, .backend = MA, UNSUP,
     .err = REFUSED("MARLIN", R_DEV("cpu")), .exact = 1,
     .po = {{MA, R_DEV("cpu")}}},
    {"xpu_ct", .fmt = CT, ON_XPU, .want = "xpu", .exact = 1},
    {"xpu_gptq", .fmt = "gptq", ON_XPU, .want = "xpu", .exact = 1},
    {"xpu_ct_g32", .fmt = CT, .gs = 32, ON_XPU, .want = "xpu"},
    {"xpu_8bit", .fmt = CT, .bits = 8, .gs = -1, ON_XPU, UNSUP,
     .err = NONE_FITS, .exact = 1,
     .po = {{"xpu", R_SCHEME("kInt8Static")}}},
    {"xpu_asym", .fmt = CT, .zp = 1, ON_XPU, UNSUP, .exact = 1,
     .po = {{"xpu", R_SCHEME("kInt4StaticAsym")}}},
    {"xpu_batched", .fmt = CT, .batched = 1, ON_XPU, UNSUP, .exact = 1,
     .po = {{"xpu", R_BAT}}},
    {"xpu_no_xpu_target", .fmt = CT, ON_XPU, .km = ST_BIT(CUDA) | ST_BIT(CPU),
     UNSUP, .exact = 1, .po = {{"xpu", R_NOBUILD("xpu")}}},
    {"explicit_marlin_on_xpu", .fmt = CT, ON_XPU, .backend = MA, UNSUP,
     .exact = 1, .po = {{MA, R_DEV("xpu")}}},
    /* ROCm: Marlin is never supported; wna16 has no ROCm kernels for the
     * backends vLLM would use there (TRITON, EMULATION), even when the
     * mask claims a ROCm target. */
    {"rocm_ct_nothing_fits", .fmt = CT, ROCM, .km = ST_KM_ALL, UNSUP,
     .err = NONE_FITS, .exact = 1,
     .po = {{FI, R_DEV(MI300)}, {MA, R_MARLIN}, {BM, R_MARLIN},
            {TR, R_NOGEN("rocm")}, {HU, R_DEV(MI300)},
            {EM, R_NOGEN("rocm")}}},
    {"rocm_ct_default_mask", .fmt = CT, ROCM, UNSUP, .err = NONE_FITS,
     .po = {{MA, R_MARLIN}, {TR, R_NOGEN("rocm")}}},
    {"explicit_marlin_rocm", .fmt = CT, ROCM, .km = ST_KM_ALL, .backend = MA,
     UNSUP, .err = REFUSED("MARLIN", R_MARLIN), .exact = 1,
     .po = {{MA, R_MARLIN}}},
};

/* ---- explicit requests ------------------------------------------------------- */

#define UNKNOWN(n) "moe_backend='" n "' is not supported for WNA16 MoE. " \
    "Expected one of ["

static const st_row_t explicit_rows[] = {
    {"explicit_auto", .fmt = "gptq", .backend = "auto", .want = MA,
     .exact = 1, .po = {{FI, R_ZPB}}},
    {"explicit_marlin", .fmt = "gptq", .backend = MA, .want = MA,
     .exact = 1},
    {"explicit_flashinfer", .fmt = CT, .gs = 32, .cc = 100, .backend = FI,
     .want = FI, .exact = 1},
    /* A refused explicit backend is never replaced (Marlin would serve). */
    {"explicit_flashinfer_refused", .fmt = "gptq", .backend = FI, UNSUP,
     .err = REFUSED("FLASHINFER_TRTLLM", R_ZPB), .exact = 1,
     .po = {{FI, R_ZPB}}},
    {"explicit_marlin_refused", .fmt = CT, .H = 192, .backend = MA, UNSUP,
     .err = REFUSED("MARLIN", R_MARLIN), .exact = 1,
     .po = {{MA, R_MARLIN}}},
    {"explicit_marlin_no_cuda_target", .fmt = "gptq", .backend = MA,
     .km = ST_BIT(CPU), UNSUP,
     .err = REFUSED("MARLIN", R_NOBUILD("cuda")), .exact = 1,
     .po = {{MA, R_NOBUILD("cuda")}}},
    {"explicit_batched_marlin_unknown", .fmt = "gptq", .batched = 1,
     .backend = BM, INVAL, .err = UNKNOWN("batched_marlin"), .exact = 1},
    {"explicit_cpu_unknown", .fmt = "gptq", ON_CPU, .backend = "cpu", INVAL,
     .err = UNKNOWN("cpu"), .exact = 1},
    {"explicit_xpu_unknown", .fmt = CT, ON_XPU, .backend = "xpu", INVAL,
     .err = UNKNOWN("xpu"), .exact = 1},
    {"explicit_vllm_spelling_unknown", .fmt = "gptq", .backend = "MARLIN",
     INVAL, .err = UNKNOWN("MARLIN")},
};

/* ---- query validation ----------------------------------------------------------- */

static const st_row_t invalid_rows[] = {
    {"no_format", INVAL, .err = "format is required"},
    {"unknown_format", .fmt = "exl2", INVAL,
     .err = "unknown format 'exl2'; known formats: "},
    {"backend_spec_is_no_format", .fmt = MA, INVAL,
     .err = "unknown format 'marlin'"},
    {"unknown_activation", .fmt = "gptq", .act = "swish", INVAL,
     .err = "unknown activation 'swish'"},
    {"bits_3", .fmt = "gptq", .bits = 3, INVAL, .err = "bits must be 4 or 8"},
    {"bits_16", .fmt = "gptq", .bits = 16, INVAL, .err = "bits"},
    {"group_size_minus_2", .fmt = "gptq", .gs = -2, INVAL,
     .err = "group_size must be -1 or positive"},
    {"hidden_negative", .fmt = "gptq", .H = -128, INVAL,
     .err = "hidden_size must be positive"},
    {"intermediate_negative", .fmt = "gptq", .I = -1, INVAL,
     .err = "intermediate_size must be positive"},
    {"experts_negative", .fmt = "gptq", .E = -1, INVAL,
     .err = "num_experts must be positive"},
    {"topk_negative", .fmt = "gptq", .K = -1, INVAL,
     .err = "top_k must be positive"},
    {"topk_above_experts", .fmt = "gptq", .E = 8, .K = 16, INVAL,
     .err = "top_k (16) exceeds num_experts (8)"},
    {"platform_out_of_range", .fmt = "gptq", .plat = (wna16_platform_t)9,
     INVAL, .err = "platform 9 is out of range"},
    {"cc_minor_out_of_range", .fmt = "gptq", .cc = -5, INVAL,
     .err = "compute capability"},
};

#define RUN(ctx, rows) st_run_all(ctx, rows, sizeof rows / sizeof rows[0])

/* 8-bit activations and is_k_full, which the rows do not carry: Marlin
 * serves int8 (the result says k is full), act-order over a tensor-parallel
 * shard of w2 is not k-full, and bad values are EINVAL. */
static void test_input_and_k_full(wna16_context_t *ctx)
{
    static const st_row_t base = {"base", .fmt = "gptq", .want = "marlin"};
    wna16_select_query_t q;
    wna16_select_result_t res;
    wna16_error_t err;
    st_query(&base, &q);
    q.quant.input_dtype = WNA16_INPUT_INT8;
    TU_OK(wna16_select(ctx, &q, &res, &err), &err);
    TU_CHECK(res.backend && !strcmp(wna16_spec_name(res.backend), "marlin"));
    TU_CHECK(res.is_k_full);
    q.quant.input_dtype = WNA16_INPUT_16BIT;
    q.quant.act_order = true;
    q.intermediate_size = 128;
    q.intermediate_size_full = 256;
    TU_OK(wna16_select(ctx, &q, &res, &err), &err);
    TU_CHECK_MSG(!res.is_k_full, "act-order over a shard is not k-full");
    q.quant.act_order = false;
    TU_OK(wna16_select(ctx, &q, &res, &err), &err);
    TU_CHECK(res.is_k_full);
    q.intermediate_size_full = 64;
    wna16_status_t st = wna16_select(ctx, &q, &res, &err);
    TU_CHECK(st == WNA16_EINVAL &&
             strstr(err.message, "intermediate_size_full (64) is smaller"));
    q.intermediate_size_full = 0;
    q.quant.input_dtype = (wna16_input_dtype_t)7;
    st = wna16_select(ctx, &q, &res, &err);
    TU_CHECK(st == WNA16_EINVAL && strstr(err.message, "input_dtype 7"));
}

int main(void)
{
    wna16_context_t *ctx = tu_context();
    RUN(ctx, format_rows);
    RUN(ctx, golden_rows);
    RUN(ctx, flashinfer_rows);
    RUN(ctx, marlin_rows);
    RUN(ctx, shape_rows);
    RUN(ctx, triton_rows);
    RUN(ctx, humming_emulation_rows);
    RUN(ctx, platform_rows);
    RUN(ctx, explicit_rows);
    RUN(ctx, invalid_rows);
    test_input_and_k_full(ctx);
    wna16_context_destroy(ctx);
    return tu_finish("test_select");
}
