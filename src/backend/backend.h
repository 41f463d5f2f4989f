// Backend: the op interface the model's forward pass (src/model) is written against, in two tiers.
//
//   * Primitives (matmul, norms, RoPE, attention, router, ...) take typed activation tensors (`Tensor`: F32 or
//     BF16 storage, strided rows) and, for the linear ops, an `Epilogue` (bias, SiLU·gate, residual add) applied
//     to the fp32 accumulators before the result is stored.
//   * Decode blocks (mla_qkv, mla_decode_attention, moe_ffn) are the fused units of a decode layer. Each has a
//     default here composed of primitives (so every backend and every test works with only the primitives); a
//     backend replaces a block with fused kernels (CUDA). The ref backend's primitives are the oracle for both.
//
// Precision is carried by the data, never by a flag: an op computes in fp32 (the ref backend in double) and rounds
// to its output's dtype; when an op's OUTPUT is BF16 it also rounds at the internal points HF's bf16 eager run
// rounds (docs/model.md §bf16): e.g. rms_norm rounds the normalized value before the weight
// multiply, RoPE rounds cos/sin and the products, attention the scores, scaled scores, probabilities and output.
// With F32 outputs every op is exact fp32. A BF16 input means its values are bf16: a backend may then multiply on
// bf16 tensor cores for weights whose dequantized values are exact in bf16 (BF16, MXFP4) or whose raw codes are
// (FP8: codes multiplied, scales applied to the fp32 partial sums) — products stay exact, only the fp32
// accumulation order differs.
//
// Conventions for every op:
//   * weights are QuantWeight views in their STORED format (prepare_weight), dequantized inside the op — never
//     re-quantized, never upcast into a persistent copy;
//   * small per-channel vectors (norm weights, biases, router bias, RoPE frequencies) are fp32 arrays in backend
//     memory (lossless copies made at model load);
//   * ops never throw; arguments are validated by the caller (the model validates shapes at load).
//
// Memory (the engine contract, docs/design.md §engine-contract): every pointer an op receives — activations,
// scratch, KV pools, step metadata (positions, slots, block tables, offsets, ids) — lives in the backend's own
// memory (`device()`): host memory for the CPU backends, device memory for CUDA. The model gets it from alloc()
// once at load (an arena sized by the largest step) and moves host data in and out only through
// upload()/download(). KV pools carry their own dtype (the cache dtype = the activation dtype).
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

// ---------------------------------------------------------------------------------------------------------------
// Activation tensors
// ---------------------------------------------------------------------------------------------------------------

// A 2-D activation tensor in backend memory: `rows` rows of `cols` elements, row r starting `r * ld` elements after
// `data`; dtype F32 or BF16. Views (row_slice, col_slice) share the storage. A 3-D activation such as q
// [tokens, heads, head_dim] is a Tensor [tokens, heads · head_dim].
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0, ld = 0;

  Tensor() = default;
  Tensor(void* d, DType t, int64_t r, int64_t c, int64_t l = -1)
      : data(d), dtype(t), rows(r), cols(c), ld(l < 0 ? c : l) {}
  static size_t size_of(DType t) { return t == DType::BF16 ? 2 : 4; }
  size_t elem_size() const { return size_of(dtype); }
  bool bf16() const { return dtype == DType::BF16; }
  bool contiguous() const { return ld == cols || rows <= 1; }
  int64_t numel() const { return rows * cols; }
  char* row_ptr(int64_t r) const { return static_cast<char*>(data) + static_cast<size_t>(r * ld) * elem_size(); }
  Tensor row_slice(int64_t r0, int64_t n) const { return {row_ptr(r0), dtype, n, cols, ld}; }
  Tensor col_slice(int64_t c0, int64_t w) const {
    return {static_cast<char*>(data) + static_cast<size_t>(c0) * elem_size(), dtype, rows, w, ld};
  }
  Tensor with_rows(int64_t n) const { return {data, dtype, n, cols, ld}; }
  float* f32() const { return static_cast<float*>(data); }
};

// What a linear op (matmul, grouped_matmul) does with the fp32 accumulator v = Σ x·w of output element (m, j),
// in this order (R = round to y's dtype; nothing for F32):
//   bias      v = R(v + bias[j])                    else v = R(v)
//   glu       v = R(R(SiLU(g)) · v),  g = R(Σ x·Wg): the same input times a second weight, no bias (glu[0] for
//             matmul, glu[g] per group for grouped_matmul; shaped like the main weight)
//   gate      v = R(R(SiLU(gate[m, j])) · v)         (a tensor shaped like y: a gate computed before)
//   residual  v = R(residual[m, j] + v)              (shaped like y; may be y itself: y += x·Wᵀ)
// and stores v. Each step equals the unfused op sequence (matmul, add bias, silu_mul, add) in the same dtypes.
struct Epilogue {
  const float* bias = nullptr;              // [w.rows] fp32
  const QuantWeight* const* glu = nullptr;  // SwiGLU in one op: y = SiLU(x·Wgᵀ) ⊙ (x·Wᵀ), W = up_proj
  const Tensor* gate = nullptr;
  const Tensor* residual = nullptr;
  bool empty() const { return !bias && !glu && !gate && !residual; }
};

// Declared FP8 activations (docs/quantization.md §declared-activations): a DeepSeek block-FP8 checkpoint declares
// `activation_scheme: dynamic` — every input row of an FP8 linear quantized to e4m3 in groups of the weight's
// block_cols (128) columns with one fp32 scale per group, as DeepSeek's inference (`act_quant`) and vLLM's W8A8
// block path do. Opt-in (`--activations declared`): the default computes above what the checkpoint declares.
struct ActFp8 {
  bool pow2_scale = false;  // quantization_config.scale_fmt "ue8m0": each s rounded up to a power of two
  // Backend memory the linear ops quantize into: at least rows · cols floats of any x they are given.
  float* scratch = nullptr;
  int64_t scratch_floats = 0;
};

// Whether a linear of weight w (and, when non-null, the SwiGLU gate weight g) runs with declared FP8 activations
// under `a` (non-null): every weight of the call is block FP8 of one block_cols whose checkpoint declares them
// (QuantWeight::act_fp8, set by the precision plan).
inline bool act_fp8_applies(const ActFp8* a, const QuantWeight& w, const QuantWeight* g = nullptr) {
  if (!a || !w.act_fp8 || w.format != WeightFormat::FP8_E4M3_BLOCK) return false;
  return !g || (g->act_fp8 && g->format == WeightFormat::FP8_E4M3_BLOCK && g->block_cols == w.block_cols);
}

// RoPE table, shared by all positions: angle(p, i) = float(p) * inv_freq[i] (fp32 multiply);
// cos/sin are multiplied by attention_factor (docs/model.md §RoPE).
struct RopeParams {
  const float* inv_freq = nullptr;  // [dim/2]
  int64_t dim = 0;                  // rotated dims (dr), even
  float attention_factor = 1.0f;
  bool interleaved = true;  // true: pairs (x[2i], x[2i+1]); false (NeoX half-split): pairs (x[i], x[i+dim/2])
};

// Which keys each query may attend to. Keys are rows 0..T-1 of a layer's cache; key row t has position t.
// Query s (position q_pos[s]) always sees only keys t <= q_pos[s] (causal). When `sel` is non-null it additionally
// restricts query s to keys { sel[s*stride + j] : j < count[s] } (DSA top-k selection, indices in [0, T)). The
// entries of a row are distinct (as the top-k produces them); negative entries and entries past the query's
// position are ignored.
struct KeySelection {
  const int32_t* sel = nullptr;    // [S, stride]
  const int32_t* count = nullptr;  // [S]
  int64_t stride = 0;
};

// MLA dimensions (docs/model.md §notation).
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
  // The context a kernel chooses its launch shape (e.g. the decode attention's key splits) from, when it may differ
  // from max_ctx: the model's reserved context, the same in an eager decode step and in a graph replay of its shape
  // (whose max_ctx is the reservation), so the two compute alike. 0: max_ctx.
  int64_t split_ctx = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Arguments of the decode blocks
// ---------------------------------------------------------------------------------------------------------------

// One layer's attention weights and vectors (backend memory), as the MLA blocks see them.
struct MlaLayer {
  MlaDims d;
  int64_t q_lora = 0;  // dq
  const QuantWeight *q_a = nullptr, *q_b = nullptr, *kv_a = nullptr, *kv_b = nullptr;
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr;  // [dq], [dc] RMSNorm weights (eps norm_eps)
  const float *q_a_bias = nullptr, *kv_a_bias = nullptr;  // attention_bias only (else null)
  float norm_eps = 1e-6f;
  RopeParams rope;
  float softmax_scale = 1.0f;
  // Declared FP8 activations for q_a, q_b and kv_a where they are block FP8 (act_fp8_applies); null: off. kv_b is
  // never: attention absorbs it (its products are not a linear of its module's input).
  const ActFp8* act = nullptr;
};

// The token-wise metadata of a step (backend memory).
struct StepTokens {
  int64_t n = 0;                   // N tokens
  const int64_t* pos = nullptr;    // [N] positions
  const int64_t* slots = nullptr;  // [N] cache slot of each token (< 0: not stored, a graph's padding row)
};

// One MoE layer (backend memory), as moe_ffn sees it. Experts [expert0, expert1) are this rank's (all on one
// rank); the others' entries may be null. shared_* are null when the layer has no shared experts.
struct MoeLayer {
  RouterParams router;
  const QuantWeight* gate = nullptr;           // router weight [E, D]
  const float* score_bias = nullptr;           // [E] e_score_correction_bias or null
  const QuantWeight* const* w_gate = nullptr;  // [E] expert gate_proj [I, D]
  const QuantWeight* const* w_up = nullptr;    // [E] expert up_proj [I, D]
  const QuantWeight* const* w_down = nullptr;  // [E] expert down_proj [D, I]
  int64_t expert0 = 0, expert1 = 0;
  int64_t inter = 0;  // I (this rank's slice)
  const QuantWeight *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr;
  int64_t shared_inter = 0;
  // Declared FP8 activations for the experts' and shared experts' linears where they are block FP8
  // (act_fp8_applies); null: off. The router stays as it is (never FP8 in these checkpoints).
  const ActFp8* act = nullptr;
};

// Scratch of the MoE blocks for M tokens (carved by the model; activation tensors in the run's dtype).
struct MoeScratch {
  float* logits = nullptr;     // [M, E] router logits (fp32, never rounded)
  int32_t* ids = nullptr;      // [M, K] selected experts, in selection order (moe_ffn leaves them here)
  float* weights = nullptr;    // [M, K] their routing weights
  int64_t* offsets = nullptr;  // [E + 1] expert groups of the M·K (token, slot) pairs
  int32_t* token = nullptr;    // [M·K] the pair's token
  float* pair_w = nullptr;     // [M·K] the pair's weight
  Tensor xs;                   // [M·K, D] gathered inputs
  Tensor eg;                   // [M·K, I] expert hidden (SiLU(gate) · up)
  Tensor ed;                   // [M·K, D] expert outputs
  Tensor sh;                   // [M, Is] shared experts' hidden
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
  // every later op fails. The server exits non-zero then (docs/design.md §cuda-backend).
  virtual bool device_lost() const { return false; }
  // Free and total bytes of the backend's memory ({0, 0} for host memory: no budget is derived from it).
  virtual std::pair<size_t, size_t> memory_info() const { return {0, 0}; }
  // The view an op receives for a checkpoint weight (CPU: `w` itself, in place; CUDA: uploaded once, as stored).
  virtual QuantWeight prepare_weight(const QuantWeight& w) { return w; }
  // The backend's native queue (CUDA: its cudaStream_t) for collectives enqueued in order with its ops (NCCL,
  // parallel/communicator.h); null for the host backends.
  virtual void* native_stream() { return nullptr; }

  // ---------------- linear ----------------
  // y[m, o] = Σ_i x[m, i] · W[o, i]  for m < x.rows, then the epilogue.  x [M, w.cols], y [M, w.rows].
  virtual void matmul(const QuantWeight& w, const Tensor& x, const Tensor& y, const Epilogue& ep = {}) = 0;
  // Preallocates what matmul needs for these weights (entries with data == null are skipped) at up to max_rows
  // rows of x in `x_dtype`, so that no later step allocates (called at reserve time; larger steps still grow it).
  virtual void reserve_matmul(const QuantWeight* const* /*w*/, size_t /*n*/, int64_t /*max_rows*/, DType /*x_dtype*/) {}
  // Expert-grouped matmul: rows offsets[g] .. offsets[g+1]-1 of x are multiplied by *w[g] (y = x·W[g]ᵀ), then the
  // epilogue (glu: ep.glu[g] per group; gate / residual rows as y's). All w[g] have the same rows/cols (formats may
  // differ). x [offsets[n_groups], cols], y [offsets[n_groups], rows]. Groups with no rows are skipped (their w[g]
  // may be null).
  virtual void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const Tensor& x,
                              const Tensor& y, const Epilogue& ep = {}) = 0;
  // ---------------- declared FP8 activations (ActFp8; docs/quantization.md §declared-activations) ----------------
  // xq [M, K] F32 = x [M, K] (F32 or BF16) quantized as declared, its scales applied. Per row, per group of `group`
  // columns (the last group of a row holds the K % group columns left, when K is not a multiple):
  //   amax = max |x| over the group (fp32); s = amax / 448 (fp32 division; pow2_scale: the smallest power of two
  //   >= that); s = 1 when s is 0 (an all-zero group, or amax below 448 · 2^-149);
  //   q = e4m3fn(x / s) (fp32 division, round to nearest even, saturating at ±448); xq = q · s (one fp32 multiply).
  // A group holding a NaN or ±Inf is NaN throughout (s = NaN). xq may not alias x. Default: the scalar host loop.
  virtual void act_quant_fp8(const Tensor& x, int64_t group, bool pow2_scale, const Tensor& xq);
  // The linear op with declared FP8 activations. w (and ep.glu[0]) block FP8 (act_fp8_applies); groups of
  // g = w.block_cols columns, q_x / s_x as act_quant_fp8 makes them, q_w / s_w the stored codes and block scales:
  //   y[m, o] = Σ_b (s_x[m, b] · s_w[o / block_rows, b]) · Σ_{k in group b} q_x[m, k] · q_w[o, k]
  // (fp32 accumulation), then the epilogue (the SwiGLU gate product from the same q_x). Default: act_quant_fp8 of x
  // into a.scratch, then matmul: the definition up to one fp32 rounding of each q·s and the order of the fp32
  // sums (the ref backend computes the definition itself: exact code products, double sums).
  virtual void matmul_act_fp8(const QuantWeight& w, const Tensor& x, const ActFp8& a, const Tensor& y,
                              const Epilogue& ep = {});
  // grouped_matmul with declared FP8 activations (every w[g], and ep.glu[g], block FP8 of one block_cols). All
  // x.rows rows are quantized (rows outside the groups too: a.scratch holds x.rows · x.cols floats). Default:
  // act_quant_fp8, then grouped_matmul.
  virtual void grouped_matmul_act_fp8(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets,
                                      const Tensor& x, const ActFp8& a, const Tensor& y, const Epilogue& ep = {});

  // out[m, :] = row ids[m] of table [V, D] (dequantized, rounded to out's dtype). ids must be in [0, V).
  virtual void embedding(const QuantWeight& table, const int32_t* ids, const Tensor& out) = 0;

  // ---------------- norms / elementwise ----------------
  // y = x · rsqrt(mean(x²) + eps) · w   per row; x, y [M, D] (may alias). BF16 y: y = bf16(w · bf16(normalized)).
  virtual void rms_norm(const Tensor& x, const float* w, float eps, const Tensor& y) = 0;
  // h = R(h + delta); y = rms_norm(h)  (the residual add fused with the next norm). Default: add, rms_norm.
  virtual void add_rms_norm(const Tensor& h, const Tensor& delta, const float* w, float eps, const Tensor& y);
  // y = (x − mean) · rsqrt(var + eps) · w + b   per row (biased variance); x, y [M, D] (may alias).
  virtual void layer_norm(const Tensor& x, const float* w, const float* b, float eps, const Tensor& y) = 0;
  // In-place RoPE on the first p.dim values of each head: head h of row t starts at element h * head_stride of
  // row t of x; row t has position pos[t]. BF16 x: cos/sin and products rounded (docs/model.md §bf16).
  virtual void rope(const Tensor& x, int64_t n_heads, int64_t head_stride, const int64_t* pos, const RopeParams& p) = 0;
  // out = SiLU(gate) · up   (out may alias gate or up). BF16 out: out = bf16(bf16(SiLU(gate)) · up).
  virtual void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // y = R(y + x).
  virtual void add(const Tensor& y, const Tensor& x) = 0;
  // dst = R(src) (a copy, converting the dtype; src and dst shaped alike, any strides).
  virtual void convert(const Tensor& src, const Tensor& dst);

  // ---------------- MLA attention (docs/model.md §MLA) ----------------
  // q [S, H·(dn+dr)]: per head q_nope then q_pe (already rotated). Keys/values are cache rows 0..T-1.
  // o [S, H·dv]. score = (q·k)·scale, masked per `sel` (KeySelection), softmax over keys, o = Σ P·v.
  //
  // Naive (prefill) form: kvb [T, H·(dn+dv)] = c·Wkv_bᵀ (k_nope then v per head), k_pe [T, dr] (rotated, shared by
  // all heads). BF16 o: scores, scaled scores, probabilities and o rounded as HF eager attention does.
  virtual void mla_attention_naive(const MlaDims& d, const Tensor& q, const Tensor& kvb, const Tensor& k_pe, int64_t T,
                                   const int64_t* q_pos, const KeySelection& sel, float scale, const Tensor& o) = 0;
  // Weight-absorbed (decode) form over the latent cache: c [T, dc] (after kv_a_layernorm), k_pe [T, dr] (rotated).
  // kv_b is kv_b_proj [H·(dn+dv), dc] in its stored format: W_UK[h] = rows h·(dn+dv) .. +dn, W_UV[h] = the next dv
  // rows. q_lat = W_UK[h]ᵀ·q_nope; score = (q_lat·c[t] + q_pe·k_pe[t])·scale; o = W_UV[h]·Σ_t P·c[t].
  // BF16 o: additionally q_lat and o_lat = Σ P·c are rounded (the operands of the absorbed products).
  virtual void mla_attention_absorbed(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const Tensor& c,
                                      const Tensor& k_pe, int64_t T, const int64_t* q_pos, const KeySelection& sel,
                                      float scale, const Tensor& o) = 0;

  // ---------------- DSA lightning indexer (docs/model.md §DSA) ----------------
  // scores[s, t] = Σ_j w[s, j] · ReLU(scale · q[s, j, :]·k[t, :])  for t <= q_pos[s], −inf otherwise.
  // q [S, n_heads·head_dim], w [S, n_heads] (already includes n_heads^-0.5), k [T, head_dim], scores [S, T] fp32.
  virtual void indexer_scores(const Tensor& q, const Tensor& w, const Tensor& k, int64_t n_heads, float scale,
                              const int64_t* q_pos, float* scores) = 0;
  // indexer_scores for tokens r0 .. r0+n-1 of a step (any of its sequences) over each token's own keys in the
  // paged index pool: scores [n, T] (row i = token r0 + i; columns past the token's position are −inf). q [n,
  // n_heads·head_dim], w [n, n_heads] (rows of the step's tokens r0 ..), q_pos = the step's positions + r0. T >= every
  // sequence's context. Default: per sequence, its keys gathered, then indexer_scores.
  virtual void indexer_scores_paged(const Tensor& q, const Tensor& w, const KvPool& pool, const StepSeqs& seqs,
                                    int64_t r0, int64_t n_heads, float scale, const int64_t* q_pos, int64_t T,
                                    float* scores);
  // Per row s: the min(k, q_pos[s]+1) highest-scoring keys among t <= q_pos[s] (t < T), ordered by score
  // descending, ties to the lower t. sel [S, k], count [S].
  virtual void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                           int32_t* count) = 0;

  // ---------------- MoE (docs/model.md §MoE) ----------------
  // logits [M, E] fp32 (x·W_gateᵀ) → s = sigmoid(logits); selection on s + bias (bias [E] or null), group-limited;
  // weights = s[ids] (normalized if norm_topk_prob) · routed_scaling_factor. ids/weights [M, K] in selection order.
  virtual void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
                      float* weights) = 0;
  // y[token[i], :] = R(y[token[i], :] + R(weight[i] · x[i, :]))  for i = 0..n-1 in order (x [n, D], y [*, D]):
  // HF eager experts, accumulated in ascending expert order.
  virtual void scatter_add_weighted(const Tensor& x, const int32_t* token, const float* weight, const Tensor& y) = 0;
  // Expert grouping: the M*K (token, slot) pairs of ids [M, K] sorted by expert ascending, then token ascending.
  // offsets [E+1] (offsets[e] = first pair of expert e, offsets[E] = M*K), token [M*K] = the pair's token,
  // weight [M*K] = weights[token, slot]. Ids must be in [0, E). All arrays in backend memory.
  virtual void moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                         int32_t* token, float* weight);
  // The routed experts' weighted combine: y [M, D] = 0, then scatter_add_weighted(x, token, weight, y) over the
  // M·K pairs moe_group made from ids [M, K] (offsets, token, weight; x [M·K, D] in that grouped order) — each
  // token's pairs added in ascending expert order. Default: exactly fill + scatter_add_weighted; a backend may use
  // the grouping to work per token (the result must be the same bits).
  virtual void moe_combine(const Tensor& x, const int32_t* ids, int64_t K, const int64_t* offsets, const int32_t* token,
                           const float* weight, const Tensor& y);

  // ---------------- data movement / small elementwise ----------------
  // dst[i, :] = R(src[rows[i], :]) for i < dst.rows.
  virtual void gather_rows(const Tensor& src, const int32_t* rows, const Tensor& dst);
  // x = R(x · s).
  virtual void scale(const Tensor& x, float s);
  // x = R(v).
  virtual void fill(const Tensor& x, float v);

  // ---------------- paged latent cache ----------------
  // Pool row slots[i], columns col0 .. col0 + src.cols  <-  row i of src (converted to pool.dtype; BF16 rounds to
  // nearest even). slots in [0, pool.rows()), or negative: that row is not stored (the padding rows of a graph step).
  virtual void kv_store(const KvPool& pool, const int64_t* slots, const Tensor& src, int64_t col0);
  // dst [n_tokens, width] = columns col0 .. col0 + dst.cols of token slots 0 .. dst.rows-1 of one sequence whose
  // block table is `blocks` (slot of token t = blocks[t / block_tokens] * block_tokens + t % block_tokens).
  virtual void kv_gather(const KvPool& pool, const int32_t* blocks, int64_t col0, const Tensor& dst);
  // Copies the first n_tokens rows of block src into block dst (copy on write of a shared partial block).
  virtual void kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens);
  // Weight-absorbed MLA over the paged latent pool for every token of the step in one call: token i of sequence s
  // (q [N, H·(dn+dr)] with rotated q_pe) attends to keys t <= pos[i] of s, t < ctx_len[s] (restricted by `sel`
  // when sel.sel is set: one row per token, indices are key positions within s). Same math and bf16 points as
  // mla_attention_absorbed over the sequence's contiguous cache (c = pool columns 0..dc, k_pe = dc..dc+dr).
  // o [N, H·dv].
  virtual void mla_attention_absorbed_paged(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b,
                                            const KvPool& pool, const StepSeqs& seqs, const int64_t* pos,
                                            const KeySelection& sel, float scale, const Tensor& o);

  // ---------------- decode blocks (defaults in src/kernels/ref/default_blocks.cpp) ----------------
  // With L.act set (declared FP8 activations) the defaults run the layer's block-FP8 linears through
  // matmul_act_fp8 / grouped_matmul_act_fp8; a fused override that does not implement that must not be called then
  // (the model calls the defaults, Backend::mla_qkv / Backend::moe_ffn, for such layers).
  // The query and latent path of MLA for the step's tokens (x [N, D] = the input-normed hidden states):
  //   cq = RMSNorm(x·W_q_aᵀ + b_q_a)            [N, dq]   (kept: the DSA indexer reads it)
  //   q  = cq·W_q_bᵀ, q_pe rotated               [N, H·(dn+dr)]
  //   kv = x·W_kv_aᵀ + b_kv_a = [c | k_pe]; c = RMSNorm(c); k_pe rotated; written to `pool` at tok.slots.
  // kv [N, dc+dr] is scratch (its contents afterwards are unspecified).
  virtual void mla_qkv(const MlaLayer& L, const Tensor& x, const StepTokens& tok, const KvPool& pool, const Tensor& cq,
                       const Tensor& q, const Tensor& kv);
  // The decode attention of a run of sequences over the paged latent cache, with the output absorption:
  // o [N, H·dv] = mla_attention_absorbed_paged(q, kv_b, pool, ...) (default: exactly that primitive).
  virtual void mla_decode_attention(const MlaLayer& L, const Tensor& q, const KvPool& pool, const StepSeqs& seqs,
                                    const int64_t* pos, const KeySelection& sel, const Tensor& o);
  // The MoE FFN of M tokens (x [M, D], post-attention-normed): router logits, selection, expert grouping, the
  // routed experts (SwiGLU), the weighted combine in ascending expert order (scatter_add_weighted semantics over
  // y zeroed first), then, with include_shared, the shared experts added: y = R(routed + shared(x)).
  // Leaves the selection in s.ids / s.weights. Default: moe_route, then moe_experts.
  virtual void moe_ffn(const MoeLayer& L, const Tensor& x, const MoeScratch& s, const Tensor& y, bool include_shared);
  // The routing alone: s.logits = x·W_gateᵀ (fp32), router() into s.ids / s.weights.
  virtual void moe_route(const MoeLayer& L, const Tensor& x, const MoeScratch& s);
  // Everything after the routing, from s.ids / s.weights (also used with ids forced by a diagnostic run).
  virtual void moe_experts(const MoeLayer& L, const Tensor& x, const MoeScratch& s, const Tensor& y,
                           bool include_shared);

  // ---------------- sampling (backend/sampling.h) ----------------
  // One token per row of logits [rows, V], every pointer in backend memory: params [rows], the rows' edits and
  // allowed-id bitmasks (indexed by the params), banned [ceil(V / 32)] bitmask words (bit set = never sampled) or
  // null, ids [rows] out. The logits are overwritten with the rows' final scores. The draws equal
  // sample_rows_reference's (the host Sampler's) bit for bit. May be recorded in a graph.
  virtual void sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params,
                           const SampleEdit* edits, const uint32_t* allow, const uint32_t* banned, int32_t* ids);

  // ---------------- graphs (decode steps replayed, docs/design.md §cuda-backend) ----------------
  // A backend that can record the ops issued between graph_begin() and graph_end() and replay them later (CUDA
  // graphs) says so here. Recorded ops are not run; they must not allocate, upload, download or sync (the model
  // runs a step eagerly at the same shapes first, so that every one-time setup of its ops has happened). A replay
  // reads whatever the recorded pointers hold at that time (the model uploads the step metadata into the same
  // buffers before each replay).
  virtual bool graphs_supported() const { return false; }
  virtual void graph_begin();                   // throws Error when graphs are not supported
  virtual int graph_end();                      // ends the recording: the new graph's id
  virtual void graph_replay(int id);            // asynchronous, like any op
  virtual void graph_release(int /*id*/) {}     // frees graph id (its id is not reused)
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

// The scalar reference backend (src/kernels/ref): fp32 math, double accumulation; `threads` = 0 → available_cpus()
// (core/threads.h).
std::unique_ptr<Backend> make_ref_backend(int threads);
// By name: "ref", "cpu" (the optimized CPU backend when built; falls back to "ref" otherwise). Throws Error on an
// unknown name.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads);
// Names accepted by make_backend in this build.
std::vector<std::string> backend_names();

}  // namespace latent
