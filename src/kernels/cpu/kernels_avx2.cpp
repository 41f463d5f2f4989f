// AVX2 + FMA + F16C kernels of the CPU backend (code in avx2_body.h, compiled here for that target).
#if defined(__x86_64__) || defined(__i386__)
#define LATENT_CPU_TARGET "avx2,fma,f16c"
#include "kernels/cpu/avx2_body.h"

namespace latent::cpu {
namespace {
const Kernels kAvx2 = {
    "avx2",
    vec_permutes,
    vec_prep_x<V8>,
    vec_matmul_rows<V8>,
    v2_dequant_row,
    v2_dot,
    v2_axpy,
    v2_scaled_add,
    v2_exp_sub_sum,
    v2_rms_norm_row,
    v2_silu_mul,
    v2_add,
    v2_round_bf16,
    v2_rope_interleaved,
    v2_rope_half,
    v2_attn_qk_tile,
    v2_attn_pv_tile,
    v2_attn_softmax_tile,
    v2_attn_pack_kt,
    vec_dot_rows<V8, float, 3, 4>,
    vec_dot_rows<V8, uint16_t, 3, 4>,
    vec_dot_rows_t<V8, float, 2, 4>,
    vec_dot_rows_t<V8, uint16_t, 2, 4>,
    vec_axpy_rows<V8, float, 3, 4>,
    vec_axpy_rows<V8, uint16_t, 3, 4>,
};
}  // namespace
const Kernels* kernels_avx2() { return &kAvx2; }
}  // namespace latent::cpu

#else
#include "kernels/cpu/cpu_kernels.h"
namespace latent::cpu {
const Kernels* kernels_avx2() { return nullptr; }
}  // namespace latent::cpu
#endif
