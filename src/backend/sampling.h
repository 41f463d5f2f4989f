// Token sampling shared by the host Sampler (runtime/sampler.h), the reference Backend::sample_rows (host memory)
// and the CUDA kernel (src/kernels/cuda/cuda_sample.cu): the per-row parameters, the exact integer arithmetic of
// the draw, and the scalar reference of the whole op. Every step below is a fixed sequence of correctly rounded
// fp32 / fp64 operations or integer arithmetic, so the host and the device compute the same bits and a seeded
// request draws the same tokens on either.
//
// The draw, given a row's final scores x (after the constraint mask, banned ids, logit_bias, penalties and
// temperature):
//   * candidates: x > -inf. The sorted order is x descending, ties by the lower id: the total order of the 64-bit
//     key (ordered fp32 bits of x) << 32 | (2^32 - 1 - id).
//   * weights w = floor(2^44 · e^(x - x_max)) as integers (sample_weight: a fixed fp32 polynomial exp, 0 below
//     x_max - 30, i.e. probabilities under 1e-13 of the top one are dropped). Sums are exact uint64 (V < 2^20).
//   * top_k keeps the first k of the sorted order; top_p the shortest prefix of those whose weight reaches
//     floor(top_p · W_k) (W_k their total); min_p the prefix before the first weight below ceil(min_p · 2^44)
//     (the top one has 2^44); the kept set is the shortest of the three prefixes (at least one token).
//   * r = floor(u · W / 2^64) with u = sample_random(key, counter) (a 64-bit hash of the request's seed, the
//     choice index and the token index: counter-based, no state), W the kept total; the token is the first kept
//     id, in ascending id order, whose running weight sum exceeds r.
// Greedy (temperature <= 0): the largest x among the non-banned ids, ties to the lower id (penalties and bias
// apply, the truncations do not). The host reference of the whole op is backend/sample_reference.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/host_device.h"

namespace latent {

// One row of a sampling batch (all plain data: it is copied to the device as is).
struct SampleRowParams {
  float temperature = 1.0f;  // <= 0: greedy
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_k = 0;    // <= 0: off
  int32_t n_edits = 0;  // edits[edit_begin .. edit_begin + n_edits): distinct token ids
  int64_t edit_begin = 0;
  int64_t allow_offset = -1;  // >= 0: bit i of allow[allow_offset + i / 32] set = id i may be sampled
  uint64_t rng_key = 0;       // the request's stream key (sample_stream_key)
  uint64_t rng_counter = 0;   // the token index within the stream
};

// A per-row change to one token's score, applied in the host Sampler's order: bias added, then the repetition
// penalty (HF: x / p if x > 0 else x · p) when seen, then presence / frequency (x − (f · count + p)) when count > 0.
struct SampleEdit {
  int32_t token = 0;
  float bias = 0.0f;
  int32_t count = 0;   // occurrences among the generated tokens
  uint32_t flags = 0;  // kSampleEditBias | kSampleEditSeen
};
constexpr uint32_t kSampleEditBias = 1, kSampleEditSeen = 2;

// A batch of rows for Backend::sample_rows (host views; the model uploads them).
struct SampleBatch {
  const SampleRowParams* rows = nullptr;
  int64_t n_rows = 0;
  const SampleEdit* edits = nullptr;
  int64_t n_edits = 0;
  const uint32_t* allow = nullptr;  // the rows' allowed-id bitmasks (SampleRowParams::allow_offset)
  int64_t n_allow = 0;
  const std::vector<bool>* banned = nullptr;  // [V] ids never sampled (vocabulary padding), or null
};

// Vocabularies up to this size keep every weight sum in 64 bits.
constexpr int64_t kSampleMaxVocab = int64_t{1} << 20;
constexpr int kSampleWeightBits = 44;

// ---- correctly rounded fp32 / fp64 operations (never contracted into FMAs) ----
LATENT_HD float sample_fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LATENT_HD float sample_fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LATENT_HD float sample_fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LATENT_HD float sample_fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LATENT_HD uint32_t sample_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
LATENT_HD float sample_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
LATENT_HD uint64_t sample_mulhi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// The sort key: larger key = earlier in the sorted order (x descending, then id ascending). Unique per id.
LATENT_HD uint64_t sample_key(float x, int32_t id) {
  uint32_t u = sample_f32_bits(x);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint64_t>(0xFFFFFFFFu - static_cast<uint32_t>(id));
}

// floor(2^44 · e^dx) for dx = x − x_max <= 0: e^dx = 2^k · p(r), r = dx − k·ln2 (two-part ln2), p a degree-7
// Taylor polynomial (|r| <= 0.35: relative error < 1e-7). 0 for dx <= -30. Exactly 2^44 at dx = 0.
LATENT_HD uint64_t sample_weight(float dx) {
  if (!(dx > -30.0f)) return 0;
  const float kf = floorf(sample_fadd(sample_fmul(dx, 1.44269502f), 0.5f));
  const float r = sample_fsub(sample_fsub(dx, sample_fmul(kf, 0.693145752f)), sample_fmul(kf, 1.42860677e-6f));
  float p = 1.98412698e-4f;                            // 1/5040
  p = sample_fadd(sample_fmul(p, r), 1.38888889e-3f);  // 1/720
  p = sample_fadd(sample_fmul(p, r), 8.33333377e-3f);  // 1/120
  p = sample_fadd(sample_fmul(p, r), 4.16666679e-2f);  // 1/24
  p = sample_fadd(sample_fmul(p, r), 1.66666672e-1f);  // 1/6
  p = sample_fadd(sample_fmul(p, r), 0.5f);
  p = sample_fadd(sample_fmul(p, r), 1.0f);
  p = sample_fadd(sample_fmul(p, r), 1.0f);
  const int k = static_cast<int>(kf);  // in [-44, 0]
  const float e = sample_fmul(p, sample_f32_from_bits(static_cast<uint32_t>(k + 127) << 23));
  const float scaled = sample_fmul(e, 17592186044416.0f);  // 2^44 (exact)
  return scaled >= 17592186044416.0f ? (uint64_t{1} << kSampleWeightBits) : static_cast<uint64_t>(scaled);
}

// top_p's target mass within a total W (>= 1): floor(top_p · W), clamped to [1, W].
LATENT_HD uint64_t sample_top_p_target(float top_p, uint64_t W) {
  const double t = static_cast<double>(top_p) * static_cast<double>(W);
  uint64_t T = t <= 0.0 ? 0 : (t >= 18446744073709551615.0 ? W : static_cast<uint64_t>(t));
  if (T < 1) T = 1;
  if (T > W) T = W;
  return T;
}
// min_p's weight threshold: ceil(min_p · 2^44).
LATENT_HD uint64_t sample_min_p_threshold(float min_p) {
  return static_cast<uint64_t>(ceil(static_cast<double>(min_p) * 17592186044416.0));
}

LATENT_HD uint64_t sample_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// The stream key of (seed, stream): one choice of a seeded request.
LATENT_HD uint64_t sample_stream_key(uint64_t seed, uint64_t stream) {
  return sample_mix64(seed) ^ sample_mix64(stream + 1);
}
// The 64 random bits of draw `counter` of a stream.
LATENT_HD uint64_t sample_random(uint64_t key, uint64_t counter) {
  return sample_mix64(key ^ sample_mix64(counter ^ 0xD1B54A32D192ED03ull));
}

// One token's score after its edit (the host Sampler's float operations, in its order).
LATENT_HD float sample_apply_edit(float x, const SampleEdit& e, const SampleRowParams& p) {
  if (e.flags & kSampleEditBias) x = sample_fadd(x, e.bias);
  if ((e.flags & kSampleEditSeen) && p.repetition_penalty != 1.0f)
    x = x > 0.0f ? sample_fdiv(x, p.repetition_penalty) : sample_fmul(x, p.repetition_penalty);
  if (e.count > 0 && (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f))
    x = sample_fsub(x, sample_fadd(sample_fmul(p.frequency_penalty, static_cast<float>(e.count)), p.presence_penalty));
  return x;
}

}  // namespace latent
