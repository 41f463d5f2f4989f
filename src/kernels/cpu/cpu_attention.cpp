// The CPU backend's weight-absorbed MLA attention (see cpu_attention.h for the plan of the work).
#include "kernels/cpu/cpu_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/aligned.h"
#include "quant/float_formats.h"

namespace latent::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kSub = 64;  // keys per sub-block (scores of all heads in L1, the keys in L1/L2)
// A token's keys are split into chunks of at least this many (fp32; bf16 activations: their own count, as several
// chunks cost bf16 a second pass over the keys): 128 lets the threads share a context of a few hundred keys by
// keys (each key read by one thread) rather than by heads (each thread reading every key).
constexpr int64_t kChunkKeys = 128, kChunkKeysBf16 = 512;
constexpr int64_t kMaxChunks = 16;  // ... and at most this many chunks

template <class V>
auto* sized(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// One token of the call: its keys (the causal range 0..n_keys-1, or keys[key_off ..] with a selection) and how
// they are chunked (a function of n_keys only).
struct Tok {
  int64_t row = 0;  // absolute row of q / o / pos / sel
  int64_t seq = 0;
  int64_t n_keys = 0;
  int64_t key_off = -1;  // into Call::keys, -1 = causal range
  int64_t per = 0;       // keys per chunk (a multiple of kSub)
  int64_t n_chunks = 0;
  int64_t slot = -1;      // first partial slot (n_chunks > 1)
  int64_t score_off = 0;  // bf16: scores [H, n_keys] at scores + score_off
};
struct Item {
  int32_t tok, chunk, h0, h1;
  int64_t cost;
};

// Call-level buffers (grow-only; owned by the calling thread).
struct Call {
  std::vector<Tok> toks;
  std::vector<Item> items;
  std::vector<int32_t> keys, tmp;
  AlignedVec<float> qcat, qt, olat, part, pstat, tstat, scores;
};
Call& call_scratch() {
  thread_local Call c;
  return c;
}

// Per worker thread.
struct Work {
  std::vector<const void*> pc, pr, pn;  // this sub-block's key parts; the next sub-block's rows (prefetched)
  AlignedVec<float> s, e, acc, m, l, panel, xp;
  std::vector<const float*> fptr;
  PrefetchCursor next;  // over pn
  std::vector<const uint16_t*> hptr;
};
Work& work_scratch() {
  thread_local Work w;
  return w;
}

void chunking(int64_t n, bool bf16, int64_t& per, int64_t& nc) {
  if (n <= 0) {
    per = nc = 0;
    return;
  }
  const int64_t ck = bf16 ? kChunkKeysBf16 : kChunkKeys;
  nc = std::min<int64_t>(kMaxChunks, (n + ck - 1) / ck);
  per = ((n + nc - 1) / nc + kSub - 1) / kSub * kSub;
  nc = (n + per - 1) / per;
}

float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Lanes per x row of the transposed queries (Call::qt): the heads padded to a whole 512-bit vector.
int64_t qt_lanes(int64_t H) { return (H + 15) / 16 * 16; }

// qt rows [x0, x0 + kQtBlock) of token m from qcat [N, H, dq2]: each head's run of x read contiguously and
// written across the block's rows (a 1-4 KiB block in L1); an element-at-a-time gather with stride dq2 cost ~85 us
// per call at 16 tokens, a fifth of a layer's attention at context 0.
constexpr int64_t kQtBlock = 16;
void transpose_q(const float* qcat, int64_t m, int64_t x0, int64_t H, int64_t dq2, int64_t ldt, float* qt) {
  const int64_t nx = std::min(kQtBlock, dq2 - x0);
  float* dst = qt + (m * dq2 + x0) * ldt;
  for (int64_t h = 0; h < H; ++h) {
    const float* src = qcat + (m * H + h) * dq2 + x0;
    for (int64_t k = 0; k < nx; ++k) dst[k * ldt + h] = src[k];
  }
  for (int64_t k = 0; k < nx; ++k) std::fill(dst + k * ldt + H, dst + (k + 1) * ldt, 0.0f);
}

struct Ctx {
  const Kernels& k;
  const AbsorbedCall& a;
  Call& cl;
  int64_t H, dc, dr, dq2, N, m0, ldt;
};

// Key idx of token tk (an index into its causal range or its selection list): its latent row (c, then k_pe in a
// pool row) and its k_pe part.
struct KeyRow {
  const void* c;
  const void* pe;
};
KeyRow key_row(const Ctx& cx, const Tok& tk, int64_t idx) {
  const AbsorbedCall& a = cx.a;
  const int64_t t = tk.key_off >= 0 ? cx.cl.keys[static_cast<size_t>(tk.key_off + idx)] : idx;
  if (a.pool) {
    const int64_t bt = a.block_tokens;
    const int64_t row = static_cast<int64_t>(a.block_table[tk.seq * a.max_blocks + t / bt]) * bt + t % bt;
    if (a.pool_bf16) {
      const uint16_t* p = static_cast<const uint16_t*>(a.pool) + row * a.width;
      return {p, p + cx.dc};
    }
    const float* p = static_cast<const float*>(a.pool) + row * a.width;
    return {p, p + cx.dc};
  }
  return {a.c + t * cx.dc, a.k_pe + t * cx.dr};
}

// Pointers to the key rows of token tk, list indices [k0, k0 + nk): w.pc = c parts, w.pr = k_pe parts.
void key_ptrs(const Ctx& cx, const Tok& tk, int64_t k0, int64_t nk, Work& w) {
  const void** pc = sized(w.pc, kSub);
  const void** pr = sized(w.pr, kSub);
  for (int64_t j = 0; j < nk; ++j) {
    const KeyRow r = key_row(cx, tk, k0 + j);
    pc[j] = r.c;
    pr[j] = r.pe;
  }
}

// Aims the kernels' prefetch cursor (w.next) at keys [k0, k0 + n) of token tk (n <= kSub; n <= 0: nothing): the
// sub-block computed after the current one. Pool rows are prefetched whole (c and k_pe are adjacent), a contiguous
// cache's c rows only.
void aim_prefetch(const Ctx& cx, const Tok& tk, int64_t k0, int64_t n, Work& w) {
  const void** pn = sized(w.pn, kSub);
  n = std::max<int64_t>(n, 0);
  for (int64_t j = 0; j < n; ++j) pn[j] = key_row(cx, tk, k0 + j).c;
  const int64_t esz = cx.a.pool && cx.a.pool_bf16 ? 2 : 4;
  w.next = PrefetchCursor{pn, n, (cx.a.pool ? cx.dc + cx.dr : cx.dc) * esz, 0, 0};
}

// The item a thread runs after the current one, claimed from the shared counter when the current item reaches its
// last sub-block (so that sub-block can prefetch the next item's first keys); -1 until claimed.
struct NextItem {
  std::atomic<int64_t>* counter = nullptr;
  int64_t n = 0, claimed = -1;
  int64_t get() {
    if (claimed < 0) claimed = counter->fetch_add(1, std::memory_order_relaxed);
    return claimed < n ? claimed : -1;
  }
};

bool keys_bf16(const Ctx& cx) { return cx.a.pool && cx.a.pool_bf16; }

// A token with fewer keys than one sub-block takes its scores from its query rows (dot_rows): transposing its
// queries would cost more than the scores (at 16 tokens of one key each, ~45 us per layer on a 2-core Zen 4). A
// function of the token's own key count, so its bits never depend on the other tokens of the step.
bool scores_transposed(const Tok& tk) { return tk.n_keys >= kSub; }

// Scores of nr heads against the sub-block's keys: from their transposed queries at qt, or (!transposed) their
// query rows at q (stride dq2).
void qk(const Ctx& cx, bool transposed, const float* q, const float* qt, int64_t nr, int64_t nk, Work& w, float* s) {
  if (!transposed) {
    if (keys_bf16(cx))
      cx.k.dot_rows_bf16(q, cx.dq2, nr, reinterpret_cast<const uint16_t* const*>(w.pc.data()),
                         reinterpret_cast<const uint16_t* const*>(w.pr.data()), cx.dc, cx.dr, nk, s, kSub, &w.next);
    else
      cx.k.dot_rows_f32(q, cx.dq2, nr, reinterpret_cast<const float* const*>(w.pc.data()),
                        reinterpret_cast<const float* const*>(w.pr.data()), cx.dc, cx.dr, nk, s, kSub, &w.next);
    return;
  }
  if (keys_bf16(cx))
    cx.k.dot_rows_t_bf16(qt, cx.ldt, nr, reinterpret_cast<const uint16_t* const*>(w.pc.data()),
                         reinterpret_cast<const uint16_t* const*>(w.pr.data()), cx.dc, cx.dr, nk, s, kSub, &w.next);
  else
    cx.k.dot_rows_t_f32(qt, cx.ldt, nr, reinterpret_cast<const float* const*>(w.pc.data()),
                        reinterpret_cast<const float* const*>(w.pr.data()), cx.dc, cx.dr, nk, s, kSub, &w.next);
}

void pv(const Ctx& cx, const float* p, int64_t nr, int64_t nk, Work& w, float* acc, bool accumulate) {
  if (keys_bf16(cx))
    cx.k.axpy_rows_bf16(p, kSub, nr, reinterpret_cast<const uint16_t* const*>(w.pc.data()), nk, cx.dc, acc, cx.dc,
                        accumulate, &w.next);
  else
    cx.k.axpy_rows_f32(p, kSub, nr, reinterpret_cast<const float* const*>(w.pc.data()), nk, cx.dc, acc, cx.dc,
                       accumulate, &w.next);
}

// Scaled scores of one sub-block row in place: dot·scale, or bf16(bf16(dot)·scale).
void scale_scores(const Ctx& cx, float* row, int64_t nk) {
  const float sc = cx.a.scale;
  if (cx.a.bf16) cx.k.round_bf16(row, nk);
  for (int64_t j = 0; j < nk; ++j) row[j] *= sc;
  if (cx.a.bf16) cx.k.round_bf16(row, nk);
}

// Online softmax statistics of one row over a sub-block of scaled scores: m, l updated; e = exp(score − m_new)
// written to `e` (may alias row). Returns the factor the row's accumulator must be multiplied by (1 = none).
float online_update(const Ctx& cx, const float* row, float* e, int64_t nk, float& m, float& l) {
  float mx = kNegInf;
  for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, row[j]);
  float alpha = 1.0f;
  if (mx > m) {
    if (m != kNegInf) {
      alpha = std::exp(m - mx);
      l *= alpha;
    }
    m = mx;
  }
  if (e != row) std::memcpy(e, row, sizeof(float) * static_cast<size_t>(nk));
  l += cx.k.exp_sub_sum(e, nk, m);
  return alpha;
}

enum Mode { kFull, kStats, kApply };

// One item: heads [h0, h1) of one token over one chunk of its keys.
//   kFull  (fp32; bf16 with a single chunk): the chunk's result — into o_lat when it is the token's only chunk,
//          else its partial (unnormalized accumulator, max, sum) into the token's slot;
//   kStats (bf16, several chunks): scaled scores stored, the chunk's max and sum into its slot;
//   kApply (bf16, several chunks): P = bf16(exp(score − M) / L) with the token's combined M, L, Σ P·c into the slot.
void run_item(const Ctx& cx, const Item& it, Mode mode, NextItem& after) {
  const AbsorbedCall& a = cx.a;
  Call& cl = cx.cl;
  const Tok& tk = cl.toks[static_cast<size_t>(it.tok)];
  const int64_t nr = it.h1 - it.h0, dc = cx.dc, H = cx.H;
  const int64_t c0 = it.chunk * tk.per, c1 = std::min(tk.n_keys, c0 + tk.per);
  const int64_t tm = tk.row - cx.m0;  // token index within the call
  Work& w = work_scratch();
  float* s = sized(w.s, nr * kSub);
  float* e = sized(w.e, nr * kSub);
  float* acc = sized(w.acc, nr * dc);
  float* m = sized(w.m, nr);
  float* l = sized(w.l, nr);
  const float* q = cl.qcat.data() + (tm * H + it.h0) * cx.dq2;
  const float* qt = cl.qt.data() + tm * cx.dq2 * cx.ldt + it.h0;  // heads h0.. in lanes 0..
  const bool transposed = scores_transposed(tk);
  const bool bf16 = a.bf16;
  float* scores = bf16 ? cl.scores.data() + tk.score_off : nullptr;  // [H, n_keys]
  for (int64_t i = 0; i < nr; ++i) {
    m[i] = kNegInf;
    l[i] = 0.0f;
  }
  const bool single = tk.n_chunks == 1;
  // The prefetch cursor for the sub-block after [k0, k0 + nk): the chunk's next one, else the first keys of the
  // thread's next item (a pass-B item only when its token runs pass B).
  auto aim_next = [&](int64_t k0, int64_t nk) {
    if (k0 + nk < c1) return aim_prefetch(cx, tk, k0 + nk, std::min(kSub, c1 - k0 - nk), w);
    const int64_t ni = after.get();
    if (ni < 0) return aim_prefetch(cx, tk, 0, 0, w);
    const Item& nx = cl.items[static_cast<size_t>(ni)];
    const Tok& nt = cl.toks[static_cast<size_t>(nx.tok)];
    const int64_t n0 = nx.chunk * nt.per, n1 = std::min(nt.n_keys, n0 + nt.per);
    const bool reads = mode != kApply || nt.n_chunks > 1;
    aim_prefetch(cx, nt, n0, reads ? std::min(kSub, n1 - n0) : 0, w);
  };
  // Pass A: scores (and, fp32, the online softmax with P·c).
  if (mode != kApply) {
    for (int64_t k0 = c0; k0 < c1; k0 += kSub) {
      const int64_t nk = std::min(kSub, c1 - k0);
      key_ptrs(cx, tk, k0, nk, w);
      aim_next(k0, nk);
      qk(cx, transposed, q, qt, nr, nk, w, s);
      for (int64_t i = 0; i < nr; ++i) {
        float* row = s + i * kSub;
        scale_scores(cx, row, nk);
        if (bf16) {
          std::memcpy(scores + (it.h0 + i) * tk.n_keys + k0, row, sizeof(float) * static_cast<size_t>(nk));
          online_update(cx, row, e + i * kSub, nk, m[i], l[i]);
        } else {
          const float alpha = online_update(cx, row, row, nk, m[i], l[i]);
          if (alpha != 1.0f && k0 > c0) {
            float* ar = acc + i * dc;
            for (int64_t x = 0; x < dc; ++x) ar[x] *= alpha;
          }
        }
      }
      if (!bf16) pv(cx, s, nr, nk, w, acc, k0 > c0);
    }
  }
  float* slot_acc = single ? nullptr : cl.part.data() + ((tk.slot + it.chunk) * H + it.h0) * dc;
  float* slot_st = single ? nullptr : cl.pstat.data() + ((tk.slot + it.chunk) * H + it.h0) * 2;
  if (!bf16) {
    if (single) {
      for (int64_t i = 0; i < nr; ++i) {
        float* out = cl.olat.data() + ((it.h0 + i) * cx.N + tm) * dc;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        for (int64_t x = 0; x < dc; ++x) out[x] = acc[i * dc + x] * inv;
      }
    } else {
      std::memcpy(slot_acc, acc, sizeof(float) * static_cast<size_t>(nr * dc));
      for (int64_t i = 0; i < nr; ++i) {
        slot_st[2 * i] = m[i];
        slot_st[2 * i + 1] = l[i];
      }
    }
    return;
  }
  if (mode == kStats) {
    for (int64_t i = 0; i < nr; ++i) {
      slot_st[2 * i] = m[i];
      slot_st[2 * i + 1] = l[i];
    }
    return;
  }
  // Pass B (bf16): P with the token's final max and sum, then Σ P·c.
  if (mode == kApply) {
    const float* ts = cl.tstat.data() + (tm * H + it.h0) * 2;
    for (int64_t i = 0; i < nr; ++i) {
      m[i] = ts[2 * i];
      l[i] = ts[2 * i + 1];
    }
  }
  for (int64_t k0 = c0; k0 < c1; k0 += kSub) {
    const int64_t nk = std::min(kSub, c1 - k0);
    key_ptrs(cx, tk, k0, nk, w);
    aim_next(k0, nk);
    for (int64_t i = 0; i < nr; ++i) {
      float* row = s + i * kSub;
      std::memcpy(row, scores + (it.h0 + i) * tk.n_keys + k0, sizeof(float) * static_cast<size_t>(nk));
      cx.k.exp_sub_sum(row, nk, m[i]);
      for (int64_t j = 0; j < nk; ++j) row[j] = row[j] / l[i];
      cx.k.round_bf16(row, nk);
    }
    pv(cx, s, nr, nk, w, acc, k0 > c0);
  }
  if (single) {
    for (int64_t i = 0; i < nr; ++i) {
      float* out = cl.olat.data() + ((it.h0 + i) * cx.N + tm) * dc;
      for (int64_t x = 0; x < dc; ++x) out[x] = bf16r(acc[i * dc + x]);
    }
  } else {
    std::memcpy(slot_acc, acc, sizeof(float) * static_cast<size_t>(nr * dc));
  }
}

// Sizes the calling thread's Work for any item of a call whose items have at most `rows` heads: which thread
// claims which item is decided at run time (an oversubscribed machine may leave a worker out of every warm-up
// call), so each participating thread grows its buffers before it claims its first item, never in the middle of
// a warm step's items.
void ready_work(int64_t rows, int64_t dc) {
  Work& w = work_scratch();
  sized(w.s, rows * kSub);
  sized(w.e, rows * kSub);
  sized(w.acc, rows * std::max<int64_t>(dc, 1));
  sized(w.m, rows);
  sized(w.l, rows);
  sized(w.pc, kSub);
  sized(w.pr, kSub);
  sized(w.pn, kSub);
}

// Runs the items (longest first) on every thread of the pool, each item claimed by one thread; every
// participating thread first readies its Work for items of up to `rows` heads.
template <class Fn>
void run_items(ThreadPool& pool, int64_t n, int64_t rows, int64_t dc, const Fn& fn) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t parts = std::min<int64_t>(pool.size(), n);
  pool.parallel_for(parts, 1, [&](int64_t, int64_t) {
    ready_work(rows, dc);
    int64_t i = next.fetch_add(1, std::memory_order_relaxed);
    while (i < n) {
      NextItem after{&next, n};
      fn(i, after);
      i = after.claimed >= 0 ? after.claimed : next.fetch_add(1, std::memory_order_relaxed);
    }
  });
}

}  // namespace

void absorbed_attention(const Kernels& k, ThreadPool& pool, const AbsorbedCall& a) {
  const int64_t H = a.heads, dn = a.nope, dr = a.rope, dv = a.v, dc = a.latent, dqk = dn + dr, dkv = dn + dv;
  const int64_t dq2 = dc + dr;
  if (a.n_seqs <= 0 || H <= 0) return;
  const int64_t m0 = a.q_begin[0], N = a.q_begin[a.n_seqs] - m0;
  if (N <= 0) return;
  Call& cl = call_scratch();
  const int64_t ldt = qt_lanes(H);
  const Ctx cx{k, a, cl, H, dc, dr, dq2, N, m0, ldt};
  const bool bf16 = a.bf16;

  // The tokens, their keys and chunks.
  cl.toks.resize(static_cast<size_t>(N));
  cl.keys.clear();
  int64_t slots = 0, score_total = 0, base_items = 0;
  bool multi_bf16 = false;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t T = a.ctx_len[s];
    for (int64_t i = a.q_begin[s]; i < a.q_begin[s + 1]; ++i) {
      Tok& t = cl.toks[static_cast<size_t>(i - m0)];
      t = Tok{};
      t.row = i;
      t.seq = s;
      const int64_t last = std::min<int64_t>(a.pos[i], T - 1);
      if (a.sel == nullptr) {
        t.n_keys = std::max<int64_t>(0, last + 1);
      } else {
        cl.tmp.clear();
        const int32_t* row = a.sel + i * a.sel_stride;
        for (int32_t j = 0; j < a.sel_count[i]; ++j)
          if (row[j] >= 0 && row[j] <= last) cl.tmp.push_back(row[j]);
        std::sort(cl.tmp.begin(), cl.tmp.end());
        cl.tmp.erase(std::unique(cl.tmp.begin(), cl.tmp.end()), cl.tmp.end());
        t.key_off = static_cast<int64_t>(cl.keys.size());
        t.n_keys = static_cast<int64_t>(cl.tmp.size());
        if (cl.keys.capacity() < cl.keys.size() + cl.tmp.size())
          cl.keys.reserve(std::max(cl.keys.size() + cl.tmp.size(), 2 * cl.keys.capacity()));
        cl.keys.insert(cl.keys.end(), cl.tmp.begin(), cl.tmp.end());
      }
      chunking(t.n_keys, bf16, t.per, t.n_chunks);
      if (t.n_chunks > 1) {
        t.slot = slots;
        slots += t.n_chunks;
        multi_bf16 = multi_bf16 || bf16;
      }
      if (bf16) {
        t.score_off = score_total;
        score_total += H * t.n_keys;
      }
      base_items += t.n_chunks;
    }
  }
  float* qcat = sized(cl.qcat, N * H * dq2);  // [N, H, dc + dr]
  // [N, dc + dr, ldt] and one vector of slack: an item's heads h0.. are read as whole vectors from lane h0.
  float* qt = sized(cl.qt, N * dq2 * ldt + 16);
  float* olat = sized(cl.olat, H * N * std::max<int64_t>(dc, 1));  // [H, N, dc]
  sized(cl.part, slots * H * std::max<int64_t>(dc, 1));            // [slot, H, dc]
  sized(cl.pstat, slots * H * 2);                                  // [slot, H, (max, sum)]
  if (multi_bf16) sized(cl.tstat, N * H * 2);                      // [N, H, (max, sum)]
  if (bf16) sized(cl.scores, std::max<int64_t>(score_total, 1));

  // Phase 1: q_lat = q_nope · W_UK[h] for all tokens, per head (W_UK rows read once: bf16 in place, other formats
  // dequantized into an fp32 panel).
  const QuantWeight& kv_b = *a.kv_b;
  pool.parallel_for(H, 1, [&](int64_t h0, int64_t h1) {
    Work& w = work_scratch();
    for (int64_t h = h0; h < h1; ++h) {
      const float* qn = a.q + (m0 * H + h) * dqk;
      float* qh = qcat + h * dq2;
      if (kv_b.format == WeightFormat::BF16) {
        const uint16_t** rows = sized(w.hptr, dn);
        for (int64_t j = 0; j < dn; ++j)
          rows[j] = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(kv_b.data) +
                                                      (h * dkv + j) * kv_b.row_bytes());
        k.axpy_rows_bf16(qn, H * dqk, N, rows, dn, dc, qh, H * dq2, false, nullptr);
      } else {
        float* panel = sized(w.panel, dn * dc);
        const float** rows = sized(w.fptr, dn);
        for (int64_t j = 0; j < dn; ++j) {
          k.dequant_row(kv_b, h * dkv + j, panel + j * dc);
          rows[j] = panel + j * dc;
        }
        k.axpy_rows_f32(qn, H * dqk, N, rows, dn, dc, qh, H * dq2, false, nullptr);
      }
      for (int64_t m = 0; m < N; ++m) {
        float* r = qh + m * H * dq2;
        if (bf16) k.round_bf16(r, dc);
        std::memcpy(r + dc, qn + m * H * dqk + dn, sizeof(float) * static_cast<size_t>(dr));
      }
    }
  });

  // The queries of the tokens with transposed scores (heads in the lanes of each x row), once per call; lanes past H
  // and the slack zero (they are read, and their results dropped).
  const int64_t xblocks = (dq2 + kQtBlock - 1) / kQtBlock;
  const bool any_transposed = std::any_of(cl.toks.begin(), cl.toks.end(), scores_transposed);
  if (any_transposed)
    pool.parallel_for(N * xblocks, 4, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u)
        if (scores_transposed(cl.toks[static_cast<size_t>(u / xblocks)]))
          transpose_q(qcat, u / xblocks, u % xblocks * kQtBlock, H, dq2, ldt, qt);
    });
  std::fill_n(qt + N * dq2 * ldt, 16, 0.0f);

  // Phase 2: items (token, chunk, heads). Heads are grouped only to give every thread work when there are few
  // chunks (a row's arithmetic does not depend on its group).
  int64_t groups = 1;
  if (pool.size() > 1 && base_items < 2 * pool.size())
    groups = std::min<int64_t>(
        H, (2 * pool.size() + std::max<int64_t>(base_items, 1) - 1) / std::max<int64_t>(base_items, 1));
  const int64_t hg = (H + groups - 1) / groups;
  cl.items.clear();
  for (int64_t t = 0; t < N; ++t) {
    const Tok& tk = cl.toks[static_cast<size_t>(t)];
    if (tk.n_keys == 0) {  // no key: o_lat = 0
      for (int64_t h = 0; h < H; ++h) std::fill_n(olat + (h * N + t) * dc, dc, 0.0f);
      continue;
    }
    for (int64_t c = 0; c < tk.n_chunks; ++c) {
      const int64_t nk = std::min(tk.n_keys, (c + 1) * tk.per) - c * tk.per;
      for (int64_t h = 0; h < H; h += hg) {
        const int64_t h1 = std::min(H, h + hg);
        cl.items.push_back({static_cast<int32_t>(t), static_cast<int32_t>(c), static_cast<int32_t>(h),
                            static_cast<int32_t>(h1), nk * (h1 - h)});
      }
    }
  }
  std::sort(cl.items.begin(), cl.items.end(), [](const Item& x, const Item& y) {
    if (x.cost != y.cost) return x.cost > y.cost;
    if (x.tok != y.tok) return x.tok < y.tok;
    if (x.chunk != y.chunk) return x.chunk < y.chunk;
    return x.h0 < y.h0;
  });
  const int64_t n_items = static_cast<int64_t>(cl.items.size());
  run_items(pool, n_items, hg, dc, [&](int64_t i, NextItem& after) {
    const Item& it = cl.items[static_cast<size_t>(i)];
    const bool multi = cl.toks[static_cast<size_t>(it.tok)].n_chunks > 1;
    run_item(cx, it, bf16 && multi ? kStats : kFull, after);
  });
  if (multi_bf16) {
    // The token's softmax max and sum over its chunks (chunk order), then the chunks' P·c.
    for (int64_t t = 0; t < N; ++t) {
      const Tok& tk = cl.toks[static_cast<size_t>(t)];
      if (tk.n_chunks <= 1) continue;
      for (int64_t h = 0; h < H; ++h) {
        float M = kNegInf;
        for (int64_t c = 0; c < tk.n_chunks; ++c)
          M = std::max(M, cl.pstat[static_cast<size_t>(((tk.slot + c) * H + h) * 2)]);
        float L = 0.0f;
        for (int64_t c = 0; c < tk.n_chunks; ++c) {
          const float* st = cl.pstat.data() + ((tk.slot + c) * H + h) * 2;
          if (st[1] > 0.0f) L += st[1] * std::exp(st[0] - M);
        }
        cl.tstat[static_cast<size_t>((t * H + h) * 2)] = M;
        cl.tstat[static_cast<size_t>((t * H + h) * 2 + 1)] = L;
      }
    }
    run_items(pool, n_items, hg, dc, [&](int64_t i, NextItem& after) {
      const Item& it = cl.items[static_cast<size_t>(i)];
      if (cl.toks[static_cast<size_t>(it.tok)].n_chunks > 1) run_item(cx, it, kApply, after);
    });
  }

  // Phase 3: per head, the chunk partials combined, then o = W_UV[h]·o_lat for all tokens.
  const bool perm = k.permutes(kv_b.format);
  pool.parallel_for(H, 1, [&](int64_t h0, int64_t h1) {
    Work& w = work_scratch();
    for (int64_t h = h0; h < h1; ++h) {
      float* oh = olat + h * N * dc;
      for (int64_t t = 0; t < N; ++t) {
        const Tok& tk = cl.toks[static_cast<size_t>(t)];
        if (tk.n_chunks <= 1) continue;
        float* out = oh + t * dc;
        if (bf16) {
          std::fill_n(out, dc, 0.0f);
          for (int64_t c = 0; c < tk.n_chunks; ++c) {
            const float* pa = cl.part.data() + ((tk.slot + c) * H + h) * dc;
            for (int64_t x = 0; x < dc; ++x) out[x] += pa[x];
          }
          k.round_bf16(out, dc);
          continue;
        }
        float M = kNegInf;
        for (int64_t c = 0; c < tk.n_chunks; ++c)
          M = std::max(M, cl.pstat[static_cast<size_t>(((tk.slot + c) * H + h) * 2)]);
        float L = 0.0f;
        std::fill_n(out, dc, 0.0f);
        for (int64_t c = 0; c < tk.n_chunks; ++c) {
          const float* st = cl.pstat.data() + ((tk.slot + c) * H + h) * 2;
          if (!(st[1] > 0.0f)) continue;
          const float wc = std::exp(st[0] - M);
          L += st[1] * wc;
          const float* pa = cl.part.data() + ((tk.slot + c) * H + h) * dc;
          for (int64_t x = 0; x < dc; ++x) out[x] += pa[x] * wc;
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        for (int64_t x = 0; x < dc; ++x) out[x] *= inv;
      }
      const float* x = oh;
      if (perm) {
        float* xp = sized(w.xp, N * dc);
        k.prep_x(kv_b.format, oh, N, dc, xp);
        x = xp;
      }
      float* o = a.o + (m0 * H + h) * dv;
      k.matmul_rows(kv_b, x, N, h * dkv + dn, h * dkv + dn + dv, o, H * dv);
      if (bf16)
        for (int64_t m = 0; m < N; ++m) k.round_bf16(o + m * H * dv, dv);
    }
  });
}

}  // namespace latent::cpu
