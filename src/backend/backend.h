// Backend: one virtual per op family; the model's forward pass (src/model) is written only against this
// interface. Conventions for every op:
//   * activations are fp32, row-major, contiguous (no strides unless a parameter says so);
//   * weights are QuantWeight views in their STORED format (memory-mapped checkpoint bytes), dequantized row by
//     row inside the op — never re-quantized, never upcast into a persistent copy;
//   * small per-channel vectors (norm weights, biases, router bias) are passed as fp32 arrays (lossless copies
//     made at model load);
//   * `bf16` = true emulates HF bf16 runs (spec §8): the op rounds its outputs (and the documented internal
//     points) to bf16 while still computing in fp32. Ops without the flag produce exact fp32 results; the model
//     rounds their outputs with round_bf16() when it runs in bf16-activation mode;
//   * ops never throw; arguments are validated by the caller (the model validates shapes at load).
// The scalar reference implementation (src/kernels/ref, make_ref_backend) is the oracle every other backend is
// compared against (op harness, tests/kernels).
//
// Memory (the engine contract, DESIGN.md "One step for many sequences"): every pointer an op receives —
// activations, scratch, KV pools, step metadata (positions, slots, block tables, offsets, ids) — lives in the
// backend's own memory (`device()`): host memory for the CPU backends, device memory for CUDA. The model gets it
// from alloc() once at load (an arena sized by the largest step) and moves host data in and out only through
// upload()/download(). Weights are QuantWeight views returned by prepare_weight() (CPU: the memory-mapped
// checkpoint itself; CUDA: the stored bytes uploaded once). Activations are fp32 storage on every backend; the
// bf16 mode rounds them to bf16 at the documented points (identical values to a bf16-storage run). KV pools carry
// their own dtype (F32 or BF16: the cache dtype = the activation dtype, lossless since bf16-mode values are
// already bf16).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "core/dtype.h"
#include "quant/weight_format.h"

namespace latent {

// RoPE table, shared by all positions: angle(p, i) = float(p) * inv_freq[i] (fp32 multiply);
// cos/sin are multiplied by attention_factor (spec §3.3).
struct RopeParams {
  const float* inv_freq = nullptr;  // [dim/2]
  int64_t dim = 0;                  // rotated dims (dr), even
  float attention_factor = 1.0f;
  bool interleaved = true;  // true: pairs (x[2i], x[2i+1]); false (NeoX half-split): pairs (x[i], x[i+dim/2])
};

// Which keys each query may attend to. Keys are rows 0..T-1 of a layer's cache; key row t has position t.
// Query s (position q_pos[s]) always sees only keys t <= q_pos[s] (causal). When `sel` is non-null it additionally
// restricts query s to keys { sel[s*stride + j] : j < count[s] } (DSA top-k selection, indices in [0, T)).
struct KeySelection {
  const int32_t* sel = nullptr;    // [S, stride]
  const int32_t* count = nullptr;  // [S]
  int64_t stride = 0;
};

// MLA dimensions (spec notation).
struct MlaDims {
  int64_t n_heads = 0;  // H
  int64_t nope = 0;     // dn
  int64_t rope = 0;     // dr
  int64_t v = 0;        // dv
  int64_t latent = 0;   // dc
  int64_t qk() const { return nope + rope; }
};

struct RouterParams {
  int64_t n_experts = 0;  // E
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 1;  // K
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

enum class Device : uint8_t { Cpu, Cuda };
const char* device_name(Device d);  // "cpu", "cuda"

// One layer's paged pool: rows [num_blocks * block_tokens, width] of `dtype` (F32 or BF16), row r = token slot
// (block r / block_tokens, offset r % block_tokens). The latent pool has width dc + dr (c after kv_a_layernorm,
// then rotated k_pe); the indexer key pool width dI.
struct KvPool {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t num_blocks = 0, block_tokens = 0, width = 0;
  int64_t rows() const { return num_blocks * block_tokens; }
};

// The sequences of one step (all arrays in backend memory). Tokens of the flat batch are grouped by sequence:
// sequence s owns tokens [q_begin[s], q_begin[s+1]); after the step it has ctx_len[s] tokens in the cache, the
// last q_begin[s+1]-q_begin[s] of them being this step's. Its cache slots are block_table[s*max_blocks + j]
// (j < ceil(ctx_len[s] / block_tokens)). Token i attends to keys t <= pos[i] of its own sequence.
struct StepSeqs {
  int64_t n_seqs = 0;
  const int32_t* q_begin = nullptr;      // [n_seqs + 1]
  const int32_t* ctx_len = nullptr;      // [n_seqs]
  const int32_t* block_table = nullptr;  // [n_seqs, max_blocks]
  int64_t max_blocks = 0;
  int64_t max_ctx = 0;  // host-known bound: max over s of ctx_len[s] (sizes scratch; a kernel may use it for grids)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int num_threads() const = 0;

  // ---------------- memory ----------------
  virtual Device device() const { return Device::Cpu; }
  // Backend memory, 64-byte aligned, uninitialized; throws Error naming `what` and the sizes when it does not fit.
  virtual void* alloc(size_t bytes, const char* what);
  virtual void dealloc(void* p);
  // Host <-> backend copies (synchronous with respect to the ops issued before).
  virtual void upload(void* dst, const void* src, size_t bytes);
  virtual void download(void* dst, const void* src, size_t bytes);
  // Backend-to-backend copy.
  virtual void copy(void* dst, const void* src, size_t bytes);
  // Waits until every op issued so far has finished (CPU: no-op).
  virtual void sync() {}
  // True once the device reported an error that leaves it unusable (CUDA: a kernel fault poisons the context);
  // every later op fails. The server exits non-zero then (spec cuda.md §1).
  virtual bool device_lost() const { return false; }
  // Free and total bytes of the backend's memory ({0, 0} for host memory: no budget is derived from it).
  virtual std::pair<size_t, size_t> memory_info() const { return {0, 0}; }
  // The view an op receives for a checkpoint weight (CPU: `w` itself, in place; CUDA: uploaded once, as stored).
  virtual QuantWeight prepare_weight(const QuantWeight& w) { return w; }
  // The backend's native queue (CUDA: its cudaStream_t) for collectives enqueued in order with its ops (NCCL,
  // parallel/communicator.h); null for the host backends.
  virtual void* native_stream() { return nullptr; }

  // ---------------- linear ----------------
  // y[m, o] = Σ_i x[m, i] · W[o, i]  for m < M.  x [M, w.cols], y [M, w.rows].
  virtual void matmul(const QuantWeight& w, const float* x, int64_t M, float* y) = 0;
  // matmul() in the bf16 activation mode: every x value is bf16-representable. A backend may then multiply on bf16
  // tensor cores (CUDA: cuBLASLt above the skinny-kernel sizes) for weights whose dequantized values are exactly
  // bf16 (BF16; MXFP4: e2m1 codes times power-of-two scales): products exact, fp32 accumulation in its own order.
  // FP8 weights (codes times fp32 scales are not bf16 values: a bf16 copy would round every weight, a precision
  // change the checkpoint did not ask for) and F32/F16 keep the exact path. The output is fp32, not rounded.
  // Default: matmul().
  virtual void matmul_bf16(const QuantWeight& w, const float* x, int64_t M, float* y) { matmul(w, x, M, y); }
  // Preallocates what matmul_bf16 needs for these weights (entries with data == null are skipped) at up to
  // max_rows rows of x, so that no later step allocates (called at reserve time; larger steps still grow it).
  virtual void reserve_matmul_bf16(const QuantWeight* const* /*w*/, size_t /*n*/, int64_t /*max_rows*/) {}
  // Expert-grouped matmul: rows offsets[g] .. offsets[g+1]-1 of x are multiplied by *w[g] (y = x·W[g]ᵀ).
  // All w[g] have the same rows/cols (formats may differ). x [offsets[n_groups], cols], y [offsets[n_groups], rows].
  // Groups with no rows are skipped (their w[g] may be null).
  virtual void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x,
                              float* y) = 0;
  // grouped_matmul() in the bf16 activation mode (every x value bf16-representable; see matmul_bf16).
  // Default: grouped_matmul().
  virtual void grouped_matmul_bf16(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets,
                                   const float* x, float* y) {
    grouped_matmul(w, n_groups, offsets, x, y);
  }
  // out[m, :] = row ids[m] of table [V, D] (dequantized). ids must be in [0, V).
  virtual void embedding(const QuantWeight& table, const int32_t* ids, int64_t M, float* out) = 0;

  // ---------------- norms / elementwise ----------------
  // y = x · rsqrt(mean(x²) + eps) · w   per row; x, y [M, D] (may alias). bf16: y = bf16(w · bf16(normalized)).
  virtual void rms_norm(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16) = 0;
  // y = (x − mean) · rsqrt(var + eps) · w + b   per row (biased variance); x, y [M, D] (may alias).
  virtual void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps, float* y,
                          bool bf16) = 0;
  // In-place RoPE on the first p.dim values of each head: head h of token t starts at
  // x + t*token_stride + h*head_stride; token t has position pos[t]. bf16: cos/sin and products rounded (spec §8).
  virtual void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
                    const int64_t* pos, const RopeParams& p, bool bf16) = 0;
  // out[i] = SiLU(gate[i]) · up[i]   (out may alias gate or up). bf16: out = bf16(bf16(SiLU(gate)) · up).
  virtual void silu_mul(const float* gate, const float* up, int64_t n, float* out, bool bf16) = 0;
  // y[i] += x[i]. bf16: y = bf16(y + x).
  virtual void add(float* y, const float* x, int64_t n, bool bf16) = 0;
  // x[i] = bf16(x[i]) (round to nearest even).
  virtual void round_bf16(float* x, int64_t n) = 0;

  // ---------------- MLA attention (spec §3.2, §3.4) ----------------
  // q [S, H, dn+dr]: per head q_nope then q_pe (already rotated). Keys/values are cache rows 0..T-1.
  // o [S, H, dv]. score = (q·k)·scale, masked per `sel` (KeySelection), softmax over keys, o = Σ P·v.
  //
  // Naive (prefill) form: kvb [T, H, dn+dv] = c·Wkv_bᵀ (k_nope then v per head), k_pe [T, dr] (rotated, shared by
  // all heads). bf16: scores, scaled scores, probabilities and o rounded as HF eager attention does.
  virtual void mla_attention_naive(const MlaDims& d, const float* q, const float* kvb, const float* k_pe, int64_t S,
                                   int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale, float* o,
                                   bool bf16) = 0;
  // Weight-absorbed (decode) form over the latent cache: c [T, dc] (after kv_a_layernorm), k_pe [T, dr] (rotated).
  // kv_b is kv_b_proj [H·(dn+dv), dc] in its stored format: W_UK[h] = rows h·(dn+dv) .. +dn, W_UV[h] = the next dv
  // rows. q_lat = W_UK[h]ᵀ·q_nope; score = (q_lat·c[t] + q_pe·k_pe[t])·scale; o = W_UV[h]·Σ_t P·c[t].
  virtual void mla_attention_absorbed(const MlaDims& d, const float* q, const QuantWeight& kv_b, const float* c,
                                      const float* k_pe, int64_t S, int64_t T, const int64_t* q_pos,
                                      const KeySelection& sel, float scale, float* o, bool bf16) = 0;

  // ---------------- DSA lightning indexer (spec §4.1) ----------------
  // scores[s, t] = Σ_j w[s, j] · ReLU(scale · q[s, j, :]·k[t, :])  for t <= q_pos[s], −inf otherwise.
  // q [S, n_heads, head_dim], w [S, n_heads] (already includes n_heads^-0.5), k [T, head_dim], scores [S, T].
  virtual void indexer_scores(const float* q, const float* w, const float* k, int64_t S, int64_t T, int64_t n_heads,
                              int64_t head_dim, float scale, const int64_t* q_pos, float* scores) = 0;
  // Per row s: the min(k, q_pos[s]+1) highest-scoring keys among t <= q_pos[s] (t < T), ordered by score
  // descending, ties to the lower t. sel [S, k], count [S].
  virtual void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                           int32_t* count) = 0;

  // ---------------- MoE (spec §5) ----------------
  // logits [M, E] fp32 (x·W_gateᵀ) → s = sigmoid(logits); selection on s + bias (bias [E] or null), group-limited;
  // weights = s[ids] (normalized if norm_topk_prob) · routed_scaling_factor. ids/weights [M, K] in selection order.
  virtual void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
                      float* weights) = 0;
  // y[token[i], :] += weight[i] · x[i, :]  for i = 0..n-1 in order (x [n, D], y [*, D]).
  // bf16: y = bf16(y + bf16(weight · x)) (HF eager experts, accumulated in ascending expert order).
  virtual void scatter_add_weighted(const float* x, const int32_t* token, const float* weight, int64_t n, int64_t D,
                                    float* y, bool bf16) = 0;
  // Expert grouping: the M*K (token, slot) pairs of ids [M, K] sorted by expert ascending, then token ascending.
  // offsets [E+1] (offsets[e] = first pair of expert e, offsets[E] = M*K), token [M*K] = the pair's token,
  // weight [M*K] = weights[token, slot]. Ids must be in [0, E). All arrays in backend memory.
  virtual void moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E,
                         int64_t* offsets, int32_t* token, float* weight);

  // ---------------- data movement / small elementwise ----------------
  // dst[i, :] = src[rows[i], :] for i < n (row width D floats).
  virtual void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t D, float* dst);
  // dst[i, 0..width) = src[i*src_stride + col0 ..) for i < n (a column slice into a contiguous output).
  virtual void copy_cols(const float* src, int64_t src_stride, int64_t col0, int64_t width, int64_t n, float* dst);
  // x[i] *= s.
  virtual void scale(float* x, int64_t n, float s);
  // x[i] = v.
  virtual void fill(float* x, int64_t n, float v);
  // y[m, :] += b for m < M (y [M, N]). bf16: each sum rounded to bf16.
  virtual void add_bias(float* y, const float* b, int64_t M, int64_t N, bool bf16);

  // ---------------- paged latent cache ----------------
  // Pool row slots[i], columns col0 .. col0+width  <-  src [n, width] (converted to pool.dtype; BF16 rounds to
  // nearest even). slots in [0, pool.rows()), or negative: that row is not stored (the padding rows of a graph step).
  virtual void kv_store(const KvPool& pool, const int64_t* slots, int64_t n, const float* src, int64_t col0,
                        int64_t width);
  // dst [n_tokens, width] fp32 = columns col0 .. col0+width of token slots 0 .. n_tokens-1 of one sequence whose
  // block table is `blocks` (slot of token t = blocks[t / block_tokens] * block_tokens + t % block_tokens).
  virtual void kv_gather(const KvPool& pool, const int32_t* blocks, int64_t n_tokens, int64_t col0, int64_t width,
                         float* dst);
  // Copies the first n_tokens rows of block src into block dst (copy on write of a shared partial block).
  virtual void kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens);
  // Weight-absorbed MLA over the paged latent pool for every token of the step in one call: token i of sequence s
  // (q [N, H, dn+dr] with rotated q_pe) attends to keys t <= pos[i] of s, t < ctx_len[s] (restricted by `sel` when
  // sel.sel is set: one row per token, indices are key positions within s). Same math and bf16 points as
  // mla_attention_absorbed over the sequence's contiguous cache (c = pool columns 0..dc, k_pe = dc..dc+dr).
  // o [N, H, dv].
  virtual void mla_attention_absorbed_paged(const MlaDims& d, const float* q, const QuantWeight& kv_b,
                                            const KvPool& pool, const StepSeqs& seqs, const int64_t* pos,
                                            const KeySelection& sel, float scale, float* o, bool bf16);

  // ---------------- sampling (backend/sampling.h) ----------------
  // One token per row of logits [rows, V], every pointer in backend memory: params [rows], the rows' edits and
  // allowed-id bitmasks (indexed by the params), banned [ceil(V / 32)] bitmask words (bit set = never sampled) or
  // null, ids [rows] out. The logits are overwritten with the rows' final scores. The draws equal
  // sample_rows_reference's (the host Sampler's) bit for bit. May be recorded in a graph.
  virtual void sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params,
                           const SampleEdit* edits, const uint32_t* allow, const uint32_t* banned, int32_t* ids);

  // ---------------- graphs (decode steps replayed, DESIGN.md / spec cuda.md §1) ----------------
  // A backend that can record the ops issued between graph_begin() and graph_end() and replay them later (CUDA
  // graphs) says so here. Recorded ops are not run; they must not allocate, upload, download or sync (the model
  // runs a step eagerly at the same shapes first, so that every one-time setup of its ops has happened). A replay
  // reads whatever the recorded pointers hold at that time (the model uploads the step metadata into the same
  // buffers before each replay).
  virtual bool graphs_supported() const { return false; }
  virtual void graph_begin();           // throws Error when graphs are not supported
  virtual int graph_end();              // ends the recording: the new graph's id
  virtual void graph_replay(int id);    // asynchronous, like any op
  virtual void graph_release(int /*id*/) {}  // frees graph id (its id is not reused)
  virtual int64_t graph_kernels(int id) const;  // kernel launches recorded in graph id (diagnostics)

 protected:
  // Grow-only scratch of the host implementations (sized by the first steps, then reused).
  std::vector<int64_t> group_fill_;
  std::vector<float> paged_c_, paged_kpe_;
};

// Batch sizes of decode graphs: a step of n sequences runs in the graph of decode_graph_bucket(n) sequences
// (padded): 1, 2, 4, 8, 16, then n itself (one graph per batch size above 16: padding there could push an expert's
// group of tokens over the skinny-kernel limit of 16 rows and change its arithmetic). Kernels whose launch shape
// depends on the number of sequences decide it from the bucket (so that a padded graph step computes each row
// exactly as an eager step does).
inline int64_t decode_graph_bucket(int64_t n) {
  if (n <= 1) return 1;
  if (n > 16) return n;
  int64_t b = 2;
  while (b < n) b *= 2;
  return b;
}

// The scalar reference backend (src/kernels/ref): fp32 math, double accumulation; `threads` = 0 → all cores.
std::unique_ptr<Backend> make_ref_backend(int threads);
// By name: "ref", "cpu" (the optimized CPU backend when built; falls back to "ref" otherwise). Throws Error on an
// unknown name.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads);
// Names accepted by make_backend in this build.
std::vector<std::string> backend_names();

}  // namespace latent
