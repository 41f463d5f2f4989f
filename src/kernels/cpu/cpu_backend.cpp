// CpuBackend: the optimized CPU implementation of every Backend op (see cpu_backend.h). The per-ISA kernels
// (cpu_kernels.h) do the arithmetic; this file splits the work over the ThreadPool and implements the op
// semantics (key selection, softmax, router selection) exactly as the ref backend defines them.
#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/memory_info.h"
#include "core/threads.h"
#include "kernels/cpu/aligned.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/weight_arena.h"
#include "kernels/ref/host_tensor.h"
#include "kernels/ref/host_typed.h"
#include "kernels/ref/ref_backend.h"
#include "quant/float_formats.h"

namespace latent {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // idempotent; needed if the first query runs inside a static constructor
#endif
  switch (isa) {
    case CpuIsa::Scalar: return true;
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::Avx2:
      return cpu::kernels_avx2() != nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::Avx512:
      return cpu::kernels_avx512() != nullptr && cpu_isa_supported(CpuIsa::Avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    default: return false;
#endif
  }
  return false;
}

std::vector<CpuIsa> cpu_isas_available() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    if (cpu_isa_supported(i)) v.push_back(i);
  return v;
}

namespace {

CpuIsa best_isa() { return cpu_isas_available().back(); }

CpuIsa resolve_isa(CpuIsa want) {
  if (cpu_isa_supported(want)) return want;
  const CpuIsa b = best_isa();
  log::warn("cpu backend: ISA level '{}' is not available on this machine; using '{}'", cpu_isa_name(want),
            cpu_isa_name(b));
  return b;
}

const cpu::Kernels& kernels_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512: return *cpu::kernels_avx512();
    case CpuIsa::Avx2: return *cpu::kernels_avx2();
    case CpuIsa::Scalar: break;
  }
  return cpu::kernels_scalar();
}

float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Per-thread scratch (ops may run concurrently on different threads; each pool thread has its own).
cpu::AlignedVec<float>& scratch(int slot) {
  thread_local cpu::AlignedVec<float> bufs[4];
  return bufs[slot];
}
float* scratch_ptr(int slot, int64_t n) {
  cpu::AlignedVec<float>& v = scratch(slot);
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Rows per parallel chunk: at least ~64 KiB of weights (or equivalent work) so scheduling stays negligible.
int64_t row_grain(const QuantWeight& w, int64_t M) {
  const int64_t per_row = std::max<int64_t>(1, w.row_bytes()) * std::max<int64_t>(1, std::min<int64_t>(M, 64));
  return std::max<int64_t>(1, (int64_t{1} << 16) / per_row);
}

class CpuBackend final : public HostTyped<CpuBackend> {
 public:
  CpuBackend(int threads, CpuIsa isa, bool realign, int64_t realign_budget)
      : pool_(threads),
        isa_(resolve_isa(isa)),
        k_(kernels_for(isa_)),
        realign_(realign && (isa_ == CpuIsa::Avx512 || isa_ == CpuIsa::Avx2)),
        realign_budget_(realign_budget) {}
  const char* name() const override { return "cpu"; }
  int num_threads() const override { return pool_.size(); }

  // With the SIMD kernels (AVX-512, AVX2) every weight is copied out of the mapped checkpoint into a
  // cpu::WeightArena: 64-byte aligned memory on transparent 2 MiB pages where the kernel gives them. The alignment is
  // for the AVX-512 kernels (safetensors aligns tensors only as far as its header's length makes them: the bench
  // checkpoints' all start at 32 mod 64, where each 512-bit load straddles two cache lines; Zen 4, 2 threads, the
  // bf16 DeepSeek-V3 bench shape at batch 1: 127-132 -> 151-155 tok/s). The pages are for both: the checkpoint's
  // page cache is only partly PMD-mapped (weight_arena.h), and a batch-1 decode step streams every weight once, so
  // on 4 KiB pages it pays a TLB miss per 4 KiB read. Measured (bench/README.md, issue 26, "AVX2 on 2 MiB pages"):
  // AVX2 batch 1 context 0, 93-137 -> 137-155 tok/s (the 32 mod 64 checkpoint); with a 64-byte aligned checkpoint
  // AVX-512 118-146 -> 141-198 and AVX2 83-141 -> 124-142. The same bytes: a placement, not a value.
  // The copies stop at half the memory available when the first one is made (core/memory_info.h): the weights past
  // that stay mapped, so a model that only fits mapped still loads. LATENT_CPU_REALIGN=0 keeps every weight mapped.
  QuantWeight prepare_weight(const QuantWeight& w) override {
    if (!realign_ || !w.data) return w;
    if (realigned_.owns(w.data)) return w;
    const size_t bytes = static_cast<size_t>(w.rows * w.row_bytes());
    if (realign_budget_ < 0) {
      realign_budget_ = host_available_memory() / 2;
      // (debug: once per backend, and every parallel rank has one; what `run` prints stays as it was)
      log::debug(
          "cpu backend: weights are copied from the checkpoint to aligned memory on huge pages for the SIMD "
          "kernels (up to {:.1f} GB; LATENT_CPU_REALIGN=0: keep them mapped)",
          static_cast<double>(realign_budget_) / 1e9);
    }
    if (bytes == 0 || realigned_bytes_ + static_cast<int64_t>(bytes) > realign_budget_) return w;
    uint8_t* copy = realigned_.alloc(bytes);
    std::memcpy(copy, w.data, bytes);
    realigned_bytes_ += static_cast<int64_t>(bytes);
    QuantWeight d = w;
    d.data = copy;
    return d;
  }

  // ---------------- linear ----------------
  void matmul_f32(const QuantWeight& w, const float* x, int64_t M, float* y) {
    const int64_t N = w.rows, K = w.cols;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
      std::fill(y, y + M * N, 0.0f);
      return;
    }
    const float* xp = x;
    if (k_.permutes(w.format)) {
      float* buf = scratch_ptr(0, M * K);
      k_.prep_x(w.format, x, M, K, buf);
      xp = buf;
    }
    pool_.parallel_for(N, row_grain(w, M),
                       [&](int64_t r0, int64_t r1) { k_.matmul_rows(w, xp, M, r0, r1, y + r0, N); });
  }

  void grouped_matmul_f32(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x,
                          float* y) {
    struct Item {
      const QuantWeight* w;
      const float* xp;
      float* y;
      int64_t M;
    };
    thread_local std::vector<Item> tl_items;  // reused: no allocation per call once grown
    std::vector<Item>& items = tl_items;      // (a reference: the workers must see this thread's vector)
    items.clear();
    int64_t N = 0, K = 0, prep_rows = 0;
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t rows = offsets[g + 1] - offsets[g];
      if (rows <= 0) continue;
      N = w[g]->rows;
      K = w[g]->cols;
      if (k_.permutes(w[g]->format)) prep_rows += rows;
      items.push_back({w[g], x + offsets[g] * K, y + offsets[g] * N, rows});
    }
    if (items.empty() || N <= 0) return;
    if (K <= 0) {
      for (const Item& it : items) std::fill(it.y, it.y + it.M * N, 0.0f);
      return;
    }
    if (prep_rows > 0) {
      float* buf = scratch_ptr(0, prep_rows * K);
      for (Item& it : items) {
        if (!k_.permutes(it.w->format)) continue;
        k_.prep_x(it.w->format, it.xp, it.M, K, buf);
        it.xp = buf;
        buf += it.M * K;
      }
    }
    // Weight rows of all groups in one flat index space, split into one range per thread by cost (a weight row
    // of a group with M activation rows costs its read plus M dot products: M + 2 units), so groups with many
    // tokens do not leave the other threads idle. Any split gives the same bits (rows are independent).
    const int64_t n_items = static_cast<int64_t>(items.size());
    int64_t max_m = 1, cost = 0;
    for (const Item& it : items) {
      max_m = std::max(max_m, it.M);
      cost += N * (it.M + 2);
    }
    const int64_t parts = pool_.parts_for(n_items * N, row_grain(*items[0].w, max_m));
    auto flat_at = [&](int64_t p) {  // first flat row of part p
      if (p >= parts) return n_items * N;
      const int64_t target = cost * p / parts;
      int64_t c = 0;
      for (int64_t i = 0; i < n_items; ++i) {
        const int64_t per = items[static_cast<size_t>(i)].M + 2, item_cost = N * per;
        if (target < c + item_cost) return i * N + (target - c + per - 1) / per;
        c += item_cost;
      }
      return n_items * N;
    };
    auto run_flat = [&](int64_t a, int64_t b) {
      while (a < b) {
        const Item& it = items[static_cast<size_t>(a / N)];
        const int64_t r0 = a % N, r1 = std::min<int64_t>(N, r0 + (b - a));
        k_.matmul_rows(*it.w, it.xp, it.M, r0, r1, it.y + r0, N);
        a += r1 - r0;
      }
    };
    if (parts <= 1) {
      run_flat(0, n_items * N);
      return;
    }
    pool_.parallel_for(parts, 1, [&](int64_t p0, int64_t p1) { run_flat(flat_at(p0), flat_at(p1)); });
  }

  void embedding_f32(const QuantWeight& table, const int32_t* ids, int64_t M, float* out) {
    const int64_t D = table.cols;
    pool_.parallel_for(M, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D)), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) k_.dequant_row(table, ids[m], out + m * D);
    });
  }

  // ---------------- norms / elementwise ----------------
  void rms_norm_f32(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16) {
    pool_.parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D)), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) k_.rms_norm_row(x + m * D, w, D, eps, y + m * D, bf16);
    });
  }

  void layer_norm_f32(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps, float* y,
                      bool bf16) {
    // Small (the indexer's k_norm): the ref formula row by row (double statistics), split over rows.
    pool_.parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D)), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) ref::layer_norm_row(x + m * D, w, b, D, eps, y + m * D, bf16);
    });
  }

  void rope_f32(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
                const int64_t* pos, const RopeParams& p, bool bf16) {
    const int64_t half = p.dim / 2;
    if (half <= 0) return;
    const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n_heads * p.dim));
    pool_.parallel_for(n_tokens, grain, [&](int64_t t0, int64_t t1) {
      float* cc = scratch_ptr(1, 2 * p.dim);
      float* ss = cc + p.dim;
      for (int64_t t = t0; t < t1; ++t) {
        const float fp = static_cast<float>(pos[t]);
        for (int64_t i = 0; i < half; ++i) {
          const float ang = fp * p.inv_freq[i];
          float c = static_cast<float>(std::cos(static_cast<double>(ang))) * p.attention_factor;
          float s = static_cast<float>(std::sin(static_cast<double>(ang))) * p.attention_factor;
          if (bf16) {
            c = bf16r(c);
            s = bf16r(s);
          }
          if (p.interleaved) {
            cc[2 * i] = cc[2 * i + 1] = c;
            ss[2 * i] = -s;
            ss[2 * i + 1] = s;
          } else {
            cc[i] = c;
            ss[i] = s;
          }
        }
        for (int64_t h = 0; h < n_heads; ++h) {
          float* v = x + t * token_stride + h * head_stride;
          if (p.interleaved)
            k_.rope_interleaved(v, cc, ss, 2 * half, bf16);
          else
            k_.rope_half(v, cc, ss, half, bf16);
        }
      }
    });
  }

  void silu_mul_f32(const float* gate, const float* up, int64_t n, float* out, bool bf16) {
    pool_.parallel_for(n, 16384,
                       [&](int64_t i0, int64_t i1) { k_.silu_mul(gate + i0, up + i0, i1 - i0, out + i0, bf16); });
  }

  void add_f32(float* y, const float* x, int64_t n, bool bf16) {
    pool_.parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) { k_.add(y + i0, x + i0, i1 - i0, bf16); });
  }

  // ---------------- MLA attention ----------------
  void mla_attention_naive_f32(const MlaDims& d, const float* q, const float* kvb, const float* k_pe, int64_t S,
                               int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale, float* o,
                               bool bf16) {
    // Flash-style (flash_core): blocks of kQueryBlock queries of one head against tiles of keys packed once per
    // block. Head-major items: the static split gives each thread whole heads (equal work under the causal mask).
    const int64_t H = d.n_heads, dn = d.nope, dr = d.rope, dv = d.v, dqk = d.qk(), dkv = dn + dv;
    if (S <= 0 || H <= 0) return;
    const int64_t nqb = (S + kQueryBlock - 1) / kQueryBlock;
    pool_.parallel_for(H * nqb, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t h = i / nqb, s0 = (i % nqb) * kQueryBlock, nq = std::min(S, s0 + kQueryBlock) - s0;
        auto pack = [&](const int32_t* klist, int64_t j0, int64_t nk, float* kt, float* vbuf, const float* zeros,
                        bool want_v, int64_t& ldv) -> const float* {
          const float* kn[kKT];
          const float* kp[kKT];
          for (int64_t j = 0; j < kKT; ++j) {
            const int64_t t = j < nk ? (klist ? klist[j0 + j] : j0 + j) : -1;
            kn[j] = t < 0 ? zeros : kvb + (t * H + h) * dkv;
            kp[j] = t < 0 ? zeros : k_pe + t * dr;
          }
          k_.attn_pack_kt(kn, dn, kt);
          k_.attn_pack_kt(kp, dr, kt + dn * kKT);
          if (!want_v) return nullptr;
          // Value rows copied even for consecutive keys: in place they are H·(dn+dv) floats apart (a power of two
          // in the usual shapes: 16 rows in one L1 set).
          for (int64_t j = 0; j < nk; ++j)
            std::memcpy(vbuf + j * dv, kn[j] + dn, sizeof(float) * static_cast<size_t>(dv));
          ldv = dv;
          return vbuf;
        };
        const float* res =
            flash_core(q + (s0 * H + h) * dqk, H * dqk, nq, dqk, dv, s0, nq, T, q_pos, sel, scale, bf16, pack);
        for (int64_t r = 0; r < nq; ++r)
          std::memcpy(o + ((s0 + r) * H + h) * dv, res + r * dv, sizeof(float) * static_cast<size_t>(dv));
      }
    });
  }

  void mla_attention_absorbed_f32(const MlaDims& d, const float* q, const QuantWeight& kv_b, const float* c,
                                  const float* k_pe, int64_t S, int64_t T, const int64_t* q_pos,
                                  const KeySelection& sel, float scale, float* o, bool bf16) {
    const int32_t q_begin[2] = {0, static_cast<int32_t>(S)};
    const int32_t ctx[1] = {static_cast<int32_t>(T)};
    cpu::AbsorbedCall a = absorbed_call(d, q, kv_b, q_pos, sel, scale, o, bf16);
    a.c = c;
    a.k_pe = k_pe;
    a.n_seqs = 1;
    a.q_begin = q_begin;
    a.ctx_len = ctx;
    cpu::absorbed_attention(k_, pool_, a);
  }

  // The paged form straight over the pool (no gather): key rows read in place through the block table (c =
  // columns 0..dc, k_pe = dc..dc+dr; fp32 or bf16 pools), all decode tokens of the step in one call.
  void mla_attention_absorbed_paged(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const KvPool& pool,
                                    const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale,
                                    const Tensor& o) override {
    // (o loaded first: only the rows of the run's tokens are written, the others must come back unchanged)
    const float* qf = host::f32_in(q, tl(0));
    float* of = host::f32_out(o, tl(3), true);
    mla_attention_absorbed_paged_f32(d, qf, kv_b, pool, seqs, pos, sel, scale, of, o.bf16());
    host::store_out(o, of);
  }
  void mla_attention_absorbed_paged_f32(const MlaDims& d, const float* q, const QuantWeight& kv_b, const KvPool& pool,
                                        const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale,
                                        float* o, bool bf16) {
    cpu::AbsorbedCall a = absorbed_call(d, q, kv_b, pos, sel, scale, o, bf16);
    a.pool = pool.data;
    a.pool_bf16 = pool.dtype == DType::BF16;
    a.block_tokens = pool.block_tokens;
    a.width = pool.width;
    a.block_table = seqs.block_table;
    a.max_blocks = seqs.max_blocks;
    a.n_seqs = seqs.n_seqs;
    a.q_begin = seqs.q_begin;
    a.ctx_len = seqs.ctx_len;
    cpu::absorbed_attention(k_, pool_, a);
  }

  // ---------------- DSA indexer ----------------
  void indexer_scores_f32(const float* q, const float* w, const float* k, int64_t S, int64_t T, int64_t n_heads,
                          int64_t head_dim, float scale, const int64_t* q_pos, float* scores) {
    // Per (query, tile of kIdxTile keys): the fp32 dots of all heads against the tile as one small GEMM (dot_rows:
    // one fixed chain per (head, key)), then per key the ReLU'd, weighted sum over heads in double, heads in order.
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    constexpr int64_t kIdxTile = 64;
    const int64_t tiles = (T + kIdxTile - 1) / kIdxTile;
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n_heads * head_dim * kIdxTile / 64));
    pool_.parallel_for(S * tiles, grain, [&](int64_t i0, int64_t i1) {
      float* dots = scratch_ptr(1, n_heads * kIdxTile);
      const float* rows[kIdxTile];
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t s = i / tiles, t0 = (i % tiles) * kIdxTile, t1 = std::min(T, t0 + kIdxTile);
        float* out = scores + s * T;
        const int64_t last = std::min<int64_t>(t1, std::max<int64_t>(t0, q_pos[s] + 1));  // keys t < last scored
        for (int64_t t = last; t < t1; ++t) out[t] = kNegInf;
        if (last <= t0) continue;
        const int64_t nk = last - t0;
        for (int64_t j = 0; j < nk; ++j) rows[j] = k + (t0 + j) * head_dim;
        k_.dot_rows_f32(q + s * n_heads * head_dim, head_dim, n_heads, rows, rows, head_dim, 0, nk, dots, kIdxTile,
                        nullptr);
        const float* ws = w + s * n_heads;
        double total[kIdxTile];
        for (int64_t j = 0; j < nk; ++j) total[j] = 0.0;
        for (int64_t h = 0; h < n_heads; ++h) {  // heads in order per key, keys across vector lanes
          const double wh = ws[h];
          const float* dh = dots + h * kIdxTile;
          for (int64_t j = 0; j < nk; ++j) {
            const double dot = static_cast<double>(dh[j]) * scale;
            total[j] += wh * (dot > 0.0 ? dot : 0.0);  // (a ReLU'd or NaN dot adds ±0: the sum is unchanged)
          }
        }
        for (int64_t j = 0; j < nk; ++j) out[t0 + j] = static_cast<float>(total[j]);
      }
    });
  }

  void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                   int32_t* count) override {
    ref().topk_select(scores, S, T, k, q_pos, sel, count);
  }

  // ---------------- MoE ----------------
  void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
              float* weights) override {
    const int64_t E = p.n_experts, K = p.top_k;
    const int64_t G = std::max<int64_t>(1, p.n_group);
    const int64_t gsize = E / G;
    const bool grouped = G > 1 && p.topk_group < G;
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    pool_.parallel_for(M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, E)), [&](int64_t m0, int64_t m1) {
      float* s = scratch_ptr(1, 2 * E + G);
      float* b = s + E;
      float* gscore = b + E;
      thread_local std::vector<int32_t> top, gtop;
      thread_local std::vector<char> keep;
      for (int64_t m = m0; m < m1; ++m) {
        const float* lg = logits + m * E;
        for (int64_t e = 0; e < E; ++e) {
          s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(lg[e]))));
          b[e] = s[e] + (bias ? bias[e] : 0.0f);
        }
        if (grouped) {
          for (int64_t g = 0; g < G; ++g) {
            float top1 = kNegInf, top2 = kNegInf;
            for (int64_t e = g * gsize; e < (g + 1) * gsize; ++e) {
              if (b[e] > top1) {
                top2 = top1;
                top1 = b[e];
              } else if (b[e] > top2) {
                top2 = b[e];
              }
            }
            gscore[g] = gsize >= 2 ? top1 + top2 : top1;
          }
          // Stable descending order of group scores (ties: lower group first), first topk_group kept.
          select_top(gscore, G, p.topk_group, gtop);
          keep.assign(static_cast<size_t>(G), 0);
          for (int32_t g : gtop) keep[static_cast<size_t>(g)] = 1;
          for (int64_t e = 0; e < E; ++e)
            if (!keep[static_cast<size_t>(e / gsize)]) b[e] = kNegInf;
        }
        select_top(b, E, K, top);
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += s[top[static_cast<size_t>(k)]];
        for (int64_t k = 0; k < K; ++k) {
          const int32_t e = top[static_cast<size_t>(k)];
          float wv = s[e];
          if (p.norm_topk_prob) wv = wv / (sum + 1e-20f);
          ids[m * K + k] = e;
          weights[m * K + k] = wv * p.routed_scaling_factor;
        }
      }
    });
  }

  void scatter_add_weighted_f32(const float* x, const int32_t* token, const float* weight, int64_t n, int64_t D,
                                float* y, bool bf16) {
    // Columns are independent; within a column the n additions stay in order (bf16 rounding is order-sensitive).
    const int64_t grain = std::max<int64_t>(256, (int64_t{1} << 16) / std::max<int64_t>(1, n));
    pool_.parallel_for(D, grain, [&](int64_t d0, int64_t d1) {
      for (int64_t i = 0; i < n; ++i)
        k_.scaled_add(weight[i], x + i * D + d0, y + static_cast<int64_t>(token[i]) * D + d0, d1 - d0, bf16);
    });
  }

  CpuIsa isa() const { return isa_; }

 private:
  // Keys of query s: causal range when there is no selection (keys not materialized), else ref::allowed_keys.
  static int64_t key_list(int64_t s, int64_t T, const int64_t* q_pos, const KeySelection& sel,
                          std::vector<int32_t>& keys) {
    if (sel.sel == nullptr) return std::max<int64_t>(0, std::min<int64_t>(q_pos[s], T - 1) + 1);
    ref::allowed_keys(s, T, q_pos, sel, keys);
    return static_cast<int64_t>(keys.size());
  }
  static int64_t key_at(const std::vector<int32_t>& keys, const KeySelection& sel, int64_t j) {
    return sel.sel == nullptr ? j : keys[static_cast<size_t>(j)];
  }
  static float scaled_score(float dot, float scale, bool bf16) {
    if (!bf16) return dot * scale;
    return bf16r(bf16r(dot) * scale);
  }
  void softmax(float* sc, int64_t n, bool bf16) const {
    if (n <= 0) return;
    float mx = sc[0];
    for (int64_t j = 1; j < n; ++j) mx = std::max(mx, sc[j]);
    const float sum = k_.exp_sub_sum(sc, n, mx);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) sc[j] = bf16 ? bf16r(sc[j] * inv) : sc[j] * inv;
  }
  // Indices of the k largest v[0..n) in descending order, ties to the lower index (the ref comparators).
  static void select_top(const float* v, int64_t n, int64_t k, std::vector<int32_t>& out) {
    out.clear();
    k = std::min(k, n);
    for (int64_t e = 0; e < n; ++e) {
      const float x = v[e];
      if (static_cast<int64_t>(out.size()) == k) {
        if (k == 0 || !(x > v[out.back()])) continue;
        out.pop_back();
      }
      size_t at = out.size();
      while (at > 0 && x > v[out[at - 1]]) --at;
      out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), static_cast<int32_t>(e));
    }
  }

  static constexpr int64_t kQueryBlock = 64;
  static constexpr int64_t kKT = cpu::kAttnKeyTile;

  // Per-thread state of one flash block (grow-only: no allocation once sized).
  struct FlashScratch {
    cpu::AlignedVec<float> kt, vt, sc, acc, mx, sum, zeros;
    std::vector<int32_t> keys, qkeys, tmp;
    std::vector<int64_t> qoff, cursor, last;
    std::vector<uint32_t> mask;
  };
  static FlashScratch& flash_scratch() {
    thread_local FlashScratch fs;
    return fs;
  }
  template <class V>
  static auto* sized(V& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
  }

  // The flash core: nq query rows qr [nq, dqk] (row stride ldq) against the keys of one sequence, in tiles of
  // kKT keys; row i belongs to token tok0 + i % tok_mod (its causal limit min(q_pos[tok], T − 1) and, with a
  // selection, selection row tok). The candidate keys are the causal range 0..max limit, or with a selection the
  // kKT-aligned windows holding the rows' allowed keys (each row's own sorted list walked alongside for its mask).
  // pack(klist, j0, nk, kt, vbuf, zeros, want_v, ldv) fills the tile kt [dqk, kKT] with keys klist[j0 + j] (or
  // j0 + j without a list) for j < nk, zeros after (`zeros`: a zero row of max(dqk, dv) floats), and when want_v
  // returns their value rows (in place or copied to the scratch vbuf [kKT, max(dqk, dv)]) with row stride ldv.
  // Online softmax (running max and sum per row, the accumulator rescaled when the max grows); bf16 (HF rounds
  // the normalized probabilities) takes two passes: max and sum first, then P·V with p = bf16(e / sum).
  // Returns the per-thread result [nq, dv]: Σ p·v (bf16-rounded when bf16).
  template <class Pack>
  const float* flash_core(const float* qr, int64_t ldq, int64_t nq, int64_t dqk, int64_t dv, int64_t tok0,
                          int64_t tok_mod, int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale,
                          bool bf16, const Pack& pack) const {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    FlashScratch& fs = flash_scratch();
    float* kt = sized(fs.kt, std::max<int64_t>(dqk, 1) * kKT);
    float* vt = sized(fs.vt, kKT * std::max<int64_t>(std::max(dv, dqk), 1));
    const float* zeros = sized(fs.zeros, std::max<int64_t>(std::max(dv, dqk), 1));  // never written
    float* sc = sized(fs.sc, nq * kKT);
    float* acc = sized(fs.acc, nq * std::max<int64_t>(dv, 1));
    float* mx = sized(fs.mx, nq);
    float* sum = sized(fs.sum, nq);
    uint32_t* mask = sized(fs.mask, nq);
    int64_t* last = sized(fs.last, nq);
    const bool use_sel = sel.sel != nullptr;
    int64_t n_keys = 0;
    const int32_t* klist = nullptr;
    if (!use_sel) {
      for (int64_t i = 0; i < nq; ++i) {
        last[i] = std::min<int64_t>(q_pos[tok0 + i % tok_mod], T - 1);
        n_keys = std::max(n_keys, last[i] + 1);
      }
    } else {
      int64_t* qoff = sized(fs.qoff, nq + 1);
      fs.qkeys.clear();
      qoff[0] = 0;
      for (int64_t i = 0; i < nq; ++i) {
        ref::allowed_keys(tok0 + i % tok_mod, T, q_pos, sel, fs.tmp);
        fs.qkeys.insert(fs.qkeys.end(), fs.tmp.begin(), fs.tmp.end());
        qoff[i + 1] = static_cast<int64_t>(fs.qkeys.size());
      }
      // Candidate keys: every position of each kKT-aligned window that holds an allowed key of some row. A row's
      // keys then fall into the same tiles whatever other rows share its block (the union only adds windows and
      // lanes masked for it, which add exact zeros), so its result does not depend on how a prompt is chunked or
      // which tokens are batched with it (prefix-cache hits and chunked prefill stay bit-identical).
      fs.tmp.assign(fs.qkeys.begin(), fs.qkeys.end());
      std::sort(fs.tmp.begin(), fs.tmp.end());
      fs.keys.clear();
      // (capacity from the bound on the windows' positions, at least 8,192 and by doubling: a decode step
      // allocates only when its context first passes a power of two above that)
      const size_t bound =
          static_cast<size_t>(std::min<int64_t>((T + kKT - 1) / kKT * kKT, static_cast<int64_t>(fs.tmp.size()) * kKT));
      if (fs.keys.capacity() < bound) fs.keys.reserve(std::max({bound, 2 * fs.keys.capacity(), size_t{8192}}));
      int64_t win_end = 0;
      for (const int32_t k : fs.tmp) {
        if (k < win_end) continue;
        const int64_t w0 = k / kKT * kKT;
        win_end = std::min<int64_t>(w0 + kKT, T);
        for (int64_t j = w0; j < win_end; ++j) fs.keys.push_back(static_cast<int32_t>(j));
      }
      klist = fs.keys.data();
      n_keys = static_cast<int64_t>(fs.keys.size());
    }
    for (int64_t i = 0; i < nq; ++i) {
      mx[i] = kNegInf;
      sum[i] = 0.0f;
    }
    std::fill(acc, acc + nq * dv, 0.0f);
    for (int pass = bf16 ? 0 : 1; pass < 2; ++pass) {
      const bool final_pass = pass == 1;
      int64_t* cursor = use_sel ? sized(fs.cursor, nq) : nullptr;
      if (use_sel) std::fill(cursor, cursor + nq, int64_t{0});
      for (int64_t j0 = 0; j0 < n_keys; j0 += kKT) {
        const int64_t nk = std::min(kKT, n_keys - j0);
        // Masks of this tile per row (bit j: key j allowed) and the range of rows with any allowed key.
        int64_t r_lo = nq, r_hi = 0;
        for (int64_t i = 0; i < nq; ++i) {
          uint32_t m = 0;
          if (!use_sel) {
            const int64_t nb = std::clamp<int64_t>(last[i] - j0 + 1, 0, nk);
            m = static_cast<uint32_t>((uint64_t{1} << nb) - 1u);
          } else {
            const int32_t* qk = fs.qkeys.data() + fs.qoff[static_cast<size_t>(i)];
            const int64_t qn = fs.qoff[static_cast<size_t>(i + 1)] - fs.qoff[static_cast<size_t>(i)];
            int64_t& c = cursor[i];
            for (int64_t j = 0; j < nk && c < qn; ++j)
              if (qk[c] == klist[j0 + j]) {
                m |= 1u << j;
                ++c;
              }
          }
          mask[i] = m;
          if (m) {
            r_lo = std::min(r_lo, i);
            r_hi = i + 1;
          }
        }
        if (r_lo >= r_hi) continue;
        int64_t ldv = dv;
        const float* v = pack(klist, j0, nk, kt, vt, zeros, final_pass, ldv);
        k_.attn_qk_tile(qr + r_lo * ldq, ldq, r_hi - r_lo, kt, dqk, sc + r_lo * kKT);
        k_.attn_softmax_tile(sc + r_lo * kKT, r_hi - r_lo, mask + r_lo, scale,
                             !bf16        ? cpu::kSoftmaxOnline
                             : final_pass ? cpu::kSoftmaxFinal
                                          : cpu::kSoftmaxStats,
                             mx + r_lo, sum + r_lo, acc + r_lo * dv, dv);
        if (final_pass) k_.attn_pv_tile(sc + r_lo * kKT, r_hi - r_lo, v, ldv, nk, dv, acc + r_lo * dv);
      }
    }
    for (int64_t i = 0; i < nq; ++i) {
      float* a = acc + i * dv;
      if (bf16) {
        for (int64_t x = 0; x < dv; ++x) a[x] = bf16r(a[x]);
      } else {
        const float inv = sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f;
        for (int64_t x = 0; x < dv; ++x) a[x] *= inv;
      }
    }
    return acc;
  }

  static cpu::AbsorbedCall absorbed_call(const MlaDims& d, const float* q, const QuantWeight& kv_b, const int64_t* pos,
                                         const KeySelection& sel, float scale, float* o, bool bf16) {
    cpu::AbsorbedCall a;
    a.heads = d.n_heads;
    a.nope = d.nope;
    a.rope = d.rope;
    a.v = d.v;
    a.latent = d.latent;
    a.q = q;
    a.kv_b = &kv_b;
    a.pos = pos;
    a.sel = sel.sel;
    a.sel_count = sel.count;
    a.sel_stride = sel.stride;
    a.scale = scale;
    a.o = o;
    a.bf16 = bf16;
    return a;
  }

  RefBackend& ref() {
    std::call_once(ref_once_, [&] { ref_ = std::make_unique<RefBackend>(pool_.size()); });
    return *ref_;
  }

  ThreadPool pool_;
  CpuIsa isa_;
  const cpu::Kernels& k_;
  bool realign_;                                  // prepare_weight copies weights to the arena (AVX-512, AVX2)
  int64_t realign_budget_, realigned_bytes_ = 0;  // bytes the copies may take (-1: not read yet), taken
  cpu::WeightArena realigned_;                    // the copies (64-byte aligned, on huge pages if it can)
  std::once_flag ref_once_;
  std::unique_ptr<RefBackend> ref_;
};

}  // namespace

CpuIsa cpu_isa_default() {
  const char* env = std::getenv("LATENT_CPU_ISA");
  if (env && *env) {
    const std::string e(env);
    CpuIsa want = best_isa();
    if (e == "avx512")
      want = CpuIsa::Avx512;
    else if (e == "avx2")
      want = CpuIsa::Avx2;
    else if (e == "scalar")
      want = CpuIsa::Scalar;
    else
      log::warn("LATENT_CPU_ISA='{}' is not one of avx512, avx2, scalar; ignored", e);
    return resolve_isa(want);
  }
  return best_isa();
}

bool cpu_realign_default() {
  const char* env = std::getenv("LATENT_CPU_REALIGN");
  if (!env || !*env) return true;
  const std::string e(env);
  if (e == "0") return false;
  if (e != "1") log::warn("LATENT_CPU_REALIGN='{}' is not 0 or 1; ignored (weights realigned)", e);
  return true;
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return make_cpu_backend(threads, cpu_isa_default()); }

std::unique_ptr<Backend> make_cpu_backend(int threads, CpuIsa isa) {
  return make_cpu_backend(threads, isa, cpu_realign_default());
}

std::unique_ptr<Backend> make_cpu_backend(int threads, CpuIsa isa, bool realign_weights, int64_t realign_budget) {
  return std::make_unique<CpuBackend>(threads, isa, realign_weights, realign_budget < 0 ? -1 : realign_budget);
}

}  // namespace latent
