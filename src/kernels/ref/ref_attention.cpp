// Scalar reference ops: MLA attention (naive and weight-absorbed) and the DSA lightning indexer.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/ref/ref_backend.h"

namespace latent {

using ref::bf16r;

void ref::allowed_keys(int64_t s, int64_t T, const int64_t* q_pos, const KeySelection& sel, std::vector<int32_t>& out) {
  out.clear();
  const int64_t last = std::min<int64_t>(q_pos[s], T - 1);
  if (sel.sel == nullptr) {
    for (int64_t t = 0; t <= last; ++t) out.push_back(static_cast<int32_t>(t));
    return;
  }
  const int32_t* row = sel.sel + s * sel.stride;
  for (int32_t j = 0; j < sel.count[s]; ++j)
    if (row[j] >= 0 && row[j] <= last) out.push_back(row[j]);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

namespace {

// Softmax over raw scores (already scaled); returns probabilities (double; bf16-rounded when asked).
void softmax_inplace(std::vector<double>& sc, bool bf16) {
  if (sc.empty()) return;
  double mx = -std::numeric_limits<double>::infinity();
  for (double v : sc) mx = std::max(mx, v);
  double sum = 0.0;
  for (double& v : sc) {
    v = std::exp(v - mx);
    sum += v;
  }
  for (double& v : sc) {
    v /= sum;
    if (bf16) v = bf16r(static_cast<float>(v));
  }
}

// Score post-processing shared by both MLA forms: dot → dot·scale (HF bf16: both rounded).
double scaled_score(double dot, float scale, bool bf16) {
  if (!bf16) return dot * static_cast<double>(scale);
  return bf16r(bf16r(static_cast<float>(dot)) * scale);
}

}  // namespace

void RefBackend::mla_attention_naive_f32(const MlaDims& d, const float* q, const float* kvb, const float* k_pe,
                                         int64_t S, int64_t T, const int64_t* q_pos, const KeySelection& sel,
                                         float scale, float* o, bool bf16) {
  const int64_t H = d.n_heads, dn = d.nope, dr = d.rope, dv = d.v, dqk = d.qk(), dkv = dn + dv;
  pool_.parallel_for(S * H, 1, [&](int64_t i0, int64_t i1) {
    std::vector<int32_t> keys;
    std::vector<double> sc;
    std::vector<double> acc(static_cast<size_t>(dv));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i / H, h = i % H;
      const float* qs = q + (s * H + h) * dqk;
      ref::allowed_keys(s, T, q_pos, sel, keys);
      sc.assign(keys.size(), 0.0);
      for (size_t j = 0; j < keys.size(); ++j) {
        const int64_t t = keys[j];
        const float* kn = kvb + (t * H + h) * dkv;
        const float* kp = k_pe + t * dr;
        double dot = 0.0;
        for (int64_t x = 0; x < dn; ++x) dot += static_cast<double>(qs[x]) * kn[x];
        for (int64_t x = 0; x < dr; ++x) dot += static_cast<double>(qs[dn + x]) * kp[x];
        sc[j] = scaled_score(dot, scale, bf16);
      }
      softmax_inplace(sc, bf16);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* v = kvb + (static_cast<int64_t>(keys[j]) * H + h) * dkv + dn;
        for (int64_t x = 0; x < dv; ++x) acc[x] += sc[j] * v[x];
      }
      float* os = o + (s * H + h) * dv;
      for (int64_t x = 0; x < dv; ++x) {
        const float v = static_cast<float>(acc[x]);
        os[x] = bf16 ? bf16r(v) : v;
      }
    }
  });
}

void RefBackend::mla_attention_absorbed_f32(const MlaDims& d, const float* q, const QuantWeight& kv_b, const float* c,
                                            const float* k_pe, int64_t S, int64_t T, const int64_t* q_pos,
                                            const KeySelection& sel, float scale, float* o, bool bf16) {
  const int64_t H = d.n_heads, dn = d.nope, dr = d.rope, dv = d.v, dc = d.latent, dqk = d.qk(), dkv = dn + dv;
  pool_.parallel_for(H, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> wuk(static_cast<size_t>(dn * dc)), wuv(static_cast<size_t>(dv * dc));
    std::vector<double> qlat(static_cast<size_t>(dc)), olat(static_cast<size_t>(dc));
    std::vector<int32_t> keys;
    std::vector<double> sc;
    for (int64_t h = h0; h < h1; ++h) {
      // W_UK[h], W_UV[h] straight from kv_b_proj in its stored format.
      for (int64_t j = 0; j < dn; ++j) dequant_row_ref(kv_b, h * dkv + j, wuk.data() + j * dc);
      for (int64_t j = 0; j < dv; ++j) dequant_row_ref(kv_b, h * dkv + dn + j, wuv.data() + j * dc);
      for (int64_t s = 0; s < S; ++s) {
        const float* qs = q + (s * H + h) * dqk;
        std::fill(qlat.begin(), qlat.end(), 0.0);
        for (int64_t j = 0; j < dn; ++j) {
          const double qj = qs[j];
          const float* wr = wuk.data() + j * dc;
          for (int64_t x = 0; x < dc; ++x) qlat[x] += qj * wr[x];
        }
        if (bf16)
          for (double& v : qlat) v = bf16r(static_cast<float>(v));
        ref::allowed_keys(s, T, q_pos, sel, keys);
        sc.assign(keys.size(), 0.0);
        for (size_t j = 0; j < keys.size(); ++j) {
          const int64_t t = keys[j];
          const float* ct = c + t * dc;
          const float* kp = k_pe + t * dr;
          double dot = 0.0;
          for (int64_t x = 0; x < dc; ++x) dot += qlat[x] * ct[x];
          for (int64_t x = 0; x < dr; ++x) dot += static_cast<double>(qs[dn + x]) * kp[x];
          sc[j] = scaled_score(dot, scale, bf16);
        }
        softmax_inplace(sc, bf16);
        std::fill(olat.begin(), olat.end(), 0.0);
        for (size_t j = 0; j < keys.size(); ++j) {
          const float* ct = c + static_cast<int64_t>(keys[j]) * dc;
          for (int64_t x = 0; x < dc; ++x) olat[x] += sc[j] * ct[x];
        }
        if (bf16)
          for (double& v : olat) v = bf16r(static_cast<float>(v));
        float* os = o + (s * H + h) * dv;
        for (int64_t j = 0; j < dv; ++j) {
          const float* wr = wuv.data() + j * dc;
          double acc = 0.0;
          for (int64_t x = 0; x < dc; ++x) acc += olat[x] * wr[x];
          const float v = static_cast<float>(acc);
          os[j] = bf16 ? bf16r(v) : v;
        }
      }
    }
  });
}

void RefBackend::indexer_scores_f32(const float* q, const float* w, const float* k, int64_t S, int64_t T,
                                    int64_t n_heads, int64_t head_dim, float scale, const int64_t* q_pos,
                                    float* scores) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  pool_.parallel_for(S, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      float* row = scores + s * T;
      for (int64_t t = 0; t < T; ++t) {
        if (t > q_pos[s]) {
          row[t] = kNegInf;
          continue;
        }
        const float* kt = k + t * head_dim;
        double total = 0.0;
        for (int64_t j = 0; j < n_heads; ++j) {
          const float* qj = q + (s * n_heads + j) * head_dim;
          double dot = 0.0;
          for (int64_t x = 0; x < head_dim; ++x) dot += static_cast<double>(qj[x]) * kt[x];
          dot *= scale;
          if (dot > 0.0) total += static_cast<double>(w[s * n_heads + j]) * dot;
        }
        row[t] = static_cast<float>(total);
      }
    }
  });
}

void RefBackend::topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                             int32_t* count) {
  pool_.parallel_for(S, 4, [&](int64_t s0, int64_t s1) {
    thread_local std::vector<int32_t> idx;  // grow-only: no allocation per call once warm
    for (int64_t s = s0; s < s1; ++s) {
      const float* row = scores + s * T;
      const int64_t n = std::min<int64_t>(q_pos[s] + 1, T);
      const size_t want = static_cast<size_t>(std::max<int64_t>(n, 0));
      if (idx.capacity() < want) idx.reserve(std::max<size_t>({want, 2 * idx.capacity(), 4096}));
      idx.resize(want);
      std::iota(idx.begin(), idx.end(), 0);
      const int64_t kk = std::min<int64_t>(k, n);
      // NaN sorts last.
      auto better = [&](int32_t a, int32_t b) {
        const float va = row[a], vb = row[b];
        const bool na = std::isnan(va), nb = std::isnan(vb);
        if (na != nb) return nb;
        if (!na && va != vb) return va > vb;
        return a < b;
      };
      std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), better);
      for (int64_t j = 0; j < kk; ++j) sel[s * k + j] = idx[j];
      count[s] = static_cast<int32_t>(kk);
    }
  });
}

}  // namespace latent
