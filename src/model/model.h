// Model: the forward pass of GlmMoeDsaForCausalLM / DeepseekV3ForCausalLM / DeepseekV32ForCausalLM
// (docs/model.md §forward) written over Backend ops, with the latent KV cache (docs/model.md §absorbed) and the DSA
// indexer key cache (docs/model.md §DSA). MTP layers (index >= num_hidden_layers) are not part of the forward pass;
// with ModelOptions::mtp_layers they are loaded for drafting (Model::mtp_draft, model/mtp.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "loader/precision_plan.h"
#include "model/kv_cache.h"
#include "model/shard.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace latent {

enum class AttentionForm {
  Auto,      // weight-absorbed for decode tokens (StepSequence::decode), naive (expanded K/V) for prompt chunks
  Naive,     // always the naive form (docs/model.md §MLA)
  Absorbed,  // always the weight-absorbed form over the latent cache (docs/model.md §absorbed)
};

// The discrete decisions of one forward call, per layer: routed expert ids [S, K] (empty on dense layers) and the
// DSA selection [S, index_topk] + counts [S] (empty = dense / no own indexer). Diagnostics (docs/model.md §bf16):
// recording them in one run (e.g. fp32) and forcing them in another (e.g. bf16) separates numeric error from flipped
// decisions.
struct ForwardDecisions {
  std::vector<std::vector<int32_t>> experts;
  std::vector<std::vector<int32_t>> index_sel, index_count;
};

struct ModelOptions {
  bool bf16_activations = false;  // round activations to bf16 where HF bf16 runs do (docs/model.md §bf16)
  // --activations declared (docs/quantization.md §declared-activations): the linears whose plan entry says the
  // checkpoint declares dynamic FP8 activations (QuantWeight::act_fp8) run with x quantized as declared
  // (Backend::matmul_act_fp8); everything else keeps the activation dtype above.
  bool act_fp8_declared = false;
  bool disable_indexer = false;  // dense causal MLA on DSA layers (diagnostic: equals DSA when T <= index_topk)
  AttentionForm attention = AttentionForm::Auto;
  // Auto: prompt rows at positions >= this take the absorbed form too (over the latent pages, like decode tokens),
  // so the naive form's expanded keys and values — [context, heads · (dn + dv)], 11.6 GB of bf16 at GLM-5's
  // 202,752 tokens — are never made for more than this many keys: the step workspace is bounded by it, not by the
  // context length. The form of a row depends on its position only, so a prompt's KV is the same however it was
  // chunked or taken from the prefix cache. (AttentionForm::Naive expands any context.)
  int64_t naive_max_context = 8192;
  // Decode steps as backend graphs (CUDA graphs) where the backend supports them: a step of n decode sequences of
  // t tokens each (t = 1: each wanting its last row of logits; t > 1, a speculative verify step of the last token
  // and t - 1 drafts: every row), within the reserve() limits, runs in the graph captured for
  // graph_seqs_for(n, t) sequences of t tokens, padded. The passes of an MTP draft step (Model::mtp_draft) whose
  // sequences all fill t slots and draft (t = n_slots in the first pass, 1 in the later ones) run in graphs of their
  // own, shaped alike; a first pass whose sequences fill different numbers of slots in a graph of its exact layout.
  // Outputs equal the eager run's bit for bit.
  bool graphs = true;
  // With graphs: a draft step whose k >= 2 passes are all graph-eligible and whose sequences all draft k tokens runs
  // as one graph — pass j + 1 embeds pass j's ids from backend memory, every pass's positions and slots staged
  // before the replay — with one download of the k drafts of every sequence at the end. Off: a graph per pass (each
  // downloading its ids). Outputs are the same either way.
  bool draft_step_graph = true;
  // Diagnostics: fill *record_decisions during forward(); or replay *force_decisions (recorded by a call with the
  // same tokens and cache length) instead of routing / top-k selection. Routing weights are still computed from
  // this run's router logits.
  ForwardDecisions* record_decisions = nullptr;
  const ForwardDecisions* force_decisions = nullptr;
  // Called while the constructor uploads the weights to a device backend (bytes done, bytes total), every ~0.5 %
  // and at the end; not called on host backends (their weights stay in the memory map).
  std::function<void(uint64_t, uint64_t)> upload_progress;
  // Multi-token prediction: load this many MTP layers (0 or 1; the plan must be built with
  // PlanOptions::mtp_layers >= this). Every step then keeps its head-input rows for mtp_draft() and the KV cache
  // must hold the MTP layers' pools (PagedKvCache / KvCache with mtp_layers).
  int64_t mtp_layers = 0;
};

// One sequence of an MTP draft step (Model::mtp_draft): the MTP layer's slots start .. start + n_slots - 1 are
// written (slot q pairs the head-input hidden state of position q-1 with the token at q; tools/mtp_reference.py),
// then n_draft greedy draft tokens are proposed after the last slot, each from the layer applied to its own output
// (slots start + n_slots .. start + n_slots + n_draft - 2 are written as scratch, overwritten by later steps).
struct MtpSequence {
  int64_t start = 0;
  int64_t n_slots = 0;              // >= 1
  std::span<const int32_t> tokens;  // [n_slots]: the token of each slot (t_start ..)
  // The hidden state of slot start + i is row hidden_row + i of the last Model::step's flat batch (its head input,
  // the final RMSNorm's output); with zero_first, slot `start` gets a zero vector instead (no previous position:
  // slot 0, or the first slot after a prefix taken from the cache).
  int64_t hidden_row = 0;
  bool zero_first = false;
  std::span<const int32_t> blocks;  // block table covering start + n_slots + max(n_draft - 1, 0) slots
  int32_t n_draft = 0;              // 0: only fill the slots
  bool decode = true;               // absorbed attention form (false: the naive form, for long prompt chunks)
};

// The sequences of the graph that runs a decode step of n sequences of t tokens each (Model::step): the batch
// padded to decode_graph_bucket(n), unless its tokens would then round to another token bucket than the real
// step's n · t (kernels decide their launch shapes from decode_graph_bucket of the token count and from the
// skinny-kernel limit of 16 rows: a padded step must compute every row as the eager one does), in which case n
// itself (one graph per batch size).
inline int64_t graph_seqs_for(int64_t n, int64_t t) {
  const int64_t b = decode_graph_bucket(n), pad = b * t, real = n * t;
  if (pad == real || (pad <= 16 && decode_graph_bucket(pad) == decode_graph_bucket(real))) return b;
  return n;
}

// Which logits rows a sequence of a step wants: none, its last token's, or every token's (teacher forcing).
enum class LogitRows : uint8_t { None, Last, All };

// One sequence of a step: its n_tokens new tokens (consecutive in Step::tokens, sequences in order) go at
// positions start .. start+n_tokens-1; `blocks` is its block table in the step's PagedKvCache and covers
// start + n_tokens tokens.
struct StepSequence {
  int64_t start = 0;
  int64_t n_tokens = 0;
  std::span<const int32_t> blocks;
  LogitRows logits = LogitRows::Last;
  // Generated tokens (decode): attention in the weight-absorbed form over the pages. Prompt chunks (prefill, any
  // length) use the naive form. Fixing the form by the kind of token, not by the chunk length, keeps a prompt's
  // KV bit-identical however it was chunked or taken from the prefix cache.
  bool decode = false;
};

// One scheduler step: N tokens of S sequences (decode tokens and prefill chunks mixed).
struct Step {
  std::span<const int32_t> tokens;
  std::span<const StepSequence> seqs;
};

// One rank of a parallel model (model/shard.h, model/parallel_model.h): the parallel layout, this rank, and its
// communicator (which must outlive the model). The default is the single-rank model.
struct RankContext {
  ParallelConfig parallel;
  int rank = 0;
  Communicator* comm = nullptr;
};

class Model {
 public:
  // cfg and plan must outlive the model (weights point into the plan's memory-mapped checkpoint). With a parallel
  // `rank`, the model holds only this rank's slices (shard_weights) and its step() must be called on every rank
  // with the same step (each with its own cache: the latent cache is replicated); the logits rows are written by
  // rank 0 only, into the `logits` every rank is given (null on every rank for none).
  Model(const ModelConfig& cfg, const PrecisionPlan& plan, Backend& backend, ModelOptions opt = {},
        const RankContext& rank = {});

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opt_; }
  void set_options(const ModelOptions& o);  // drops the decode graphs (they recorded the old options)
  Backend& backend() { return be_; }
  const ModelWeights& weights() const { return w_; }
  const RankContext& rank_context() const { return rank_; }
  const ShardDims& shard() const { return sd_; }
  int64_t shard_bytes() const { return shard_store_.bytes; }  // owned copies of column slices (parallel only)

  // The batched forward of one step: position-wise work (embedding, norms, every Linear, router, experts) runs
  // once over all N tokens; attention and the DSA indexer per sequence over its pages; the lm_head only on the rows
  // that want logits. Writes every new token's cache entries into `cache` at the slots its block table names.
  // logits (host memory): the wanted rows in sequence order ([rows, V]; a Last sequence has 1 row, All n_tokens).
  // hidden: if non-null, resized to [L+1, N, D] with HF's hidden_states convention: entry 0 = embeddings,
  //   entry i (1..L-1) = output of decoder layer i-1, entry L = final-norm output.
  // Validates the step (token ids, block tables, sizes) and throws Error before touching the cache.
  // sampling (optional): one row per logits row (Backend::sample_rows on the head's output, in backend memory):
  // ids [rows] (host memory) get the sampled tokens; logits may then be null (nothing is downloaded but the ids).
  // Not with a parallel model.
  void step(const Step& step, PagedKvCache& cache, float* logits, std::vector<float>* hidden = nullptr,
            const SampleBatch* sampling = nullptr, int32_t* ids = nullptr);

  // A step of one sequence: runs ids at positions cache.length() .. +S-1 and appends them to the cache. A single
  // token after the first call is a decode token (absorbed attention), anything else a prompt chunk.
  // logits: [S, V] (all_rows) or [1, V] (only the last token), nullptr for none. A failed call leaves the cache as
  // it was.
  void forward(std::span<const int32_t> ids, KvCache& cache, float* logits, bool all_rows = true,
               std::vector<float>* hidden = nullptr);

  // Sizes the step workspace (backend memory, allocated once) for steps of up to max_tokens tokens, max_seqs
  // sequences, max_ctx tokens of context per sequence and max_blocks blocks per table. A larger step grows it
  // (counted by workspace_grows(); the server reserves its limits at load so that it never grows).
  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_ctx, int64_t max_blocks);
  int64_t workspace_grows() const { return ws_grows_; }
  // Decode-graph counters: graphs captured, steps replayed from a graph (decode and verify steps); kernel launches
  // in the graph of `seqs` sequences of `rows_per_seq` tokens (graph_seqs_for; 0 when none is captured).
  int64_t graph_captures() const { return graph_captures_; }
  int64_t graph_replays() const { return graph_replays_; }
  int64_t graph_kernels(int64_t seqs, int64_t rows_per_seq = 1) const;
  // The same for the passes of the MTP draft steps (mtp_draft): passes run (eager or graphed), graphs captured,
  // passes replayed from a graph, kernel launches in the draft graph of `seqs` sequences of `rows_per_seq` slots
  // (the largest of the first-pass and later-pass graphs of that shape).
  int64_t draft_passes() const { return draft_passes_; }
  int64_t draft_graph_captures() const { return draft_graph_captures_; }
  int64_t draft_graph_replays() const { return draft_graph_replays_; }
  int64_t draft_graph_kernels(int64_t seqs, int64_t rows_per_seq = 1) const;
  // Draft steps run as one graph of all their passes (ModelOptions::draft_step_graph), passes that ran in a replayed
  // draft graph (a replayed one-graph step counts its k passes), and downloads of draft ids (one per pass that drafts
  // on the per-pass route, one per step on the one-graph route).
  int64_t draft_step_graphs() const { return draft_step_graphs_; }
  int64_t draft_passes_replayed() const { return draft_passes_replayed_; }
  int64_t draft_id_downloads() const { return draft_id_downloads_; }
  // Kernel launches in the one-graph draft step of `seqs` sequences filling `slots` slots each and drafting k
  // (0 when none is captured).
  int64_t draft_step_graph_kernels(int64_t seqs, int64_t slots, int64_t k) const;
  // Ragged first draft passes (sequences filling different numbers of slots) get a graph per layout seen (sequences,
  // tokens): a new one is captured while fewer than this many are held, else the pass runs eagerly, so that a
  // server's graphs stay bounded.
  static constexpr int64_t kMaxRaggedGraphs = 64;
  int64_t ragged_draft_graphs() const;  // ragged graphs held (either route)
  int64_t workspace_bytes() const { return static_cast<int64_t>(ws_cap_); }
  // The cache dtype of this model's activation mode (F32, or BF16 with bf16 activations).
  DType cache_dtype() const { return opt_.bf16_activations ? DType::BF16 : DType::F32; }
  // The dtype of the activations (F32, or BF16 with bf16_activations: bf16 storage on every backend).
  DType activation_dtype() const { return act_; }

  // Convenience: a prefill from an empty cache returning [S, V] logits.
  std::vector<float> logits(std::span<const int32_t> ids);

  // ---- multi-token prediction (model/mtp.cpp; needs ModelOptions::mtp_layers) ----
  int64_t mtp_layers() const { return static_cast<int64_t>(w_.mtp.size()); }
  // One draft step over the sequences of the last step(): writes their MTP slots into `cache` (layer L's pools)
  // and the proposals into drafts (n_draft per sequence, in order; greedy on the MTP head, banned ids skipped).
  // Nothing but the ids is downloaded. logits (optional, host [Σ n_draft, V]): the MTP head's logits of every
  // draft (tests). Throws Error (before any write) on a malformed step.
  void mtp_draft(std::span<const MtpSequence> seqs, PagedKvCache& cache, int32_t* drafts,
                 const std::vector<bool>* banned = nullptr, float* logits = nullptr);

 private:
  struct Dims;
  struct Buffers;
  struct Meta;
  // Carves every buffer of a step from the workspace (or, with base == nullptr, only counts the bytes).
  size_t carve(const Dims& d, char* base, Buffers& b) const;
  // The step metadata arrays alone (carve's first buffers, in its order) from base + off; off moves past them.
  void carve_meta(const Dims& d, char* base, size_t& off, Buffers& b) const;
  // Host pointers into a filled metadata image (Meta keeps them: q_begin [S + 1], context lengths [S]).
  struct MetaHost {
    const int32_t *q_begin = nullptr, *ctx = nullptr;
  };
  // Writes the metadata of a step (tokens, positions, slots, block tables, rows; with mtp_hrows the draft pass's
  // hidden rows and concat order) into `host`, the image of the backend arrays carved in b from dev_base.
  MetaHost fill_meta(const Step& st, const PagedKvCache& cache, int64_t max_blocks, const Buffers& b,
                     const char* dev_base, char* host, std::span<const int32_t> mtp_hrows, int64_t n_real) const;
  Dims dims_for(int64_t n_tokens, int64_t n_seqs, int64_t max_ctx, int64_t max_blocks, int64_t logit_rows) const;
  void ensure_workspace(const Dims& d);
  void replace_workspace(size_t bytes);  // frees the workspace and allocates `bytes` of backend memory
  // capture: record the ops into a backend graph (logits stay in the workspace, nothing is downloaded).
  void forward_step(const Step& st, PagedKvCache& cache, const Meta& m, Buffers& b, float* logits,
                    std::vector<float>* hidden, bool capture = false);
  // Shape of a validated step: max context, max block-table length, logits rows, some DSA selection needed.
  struct StepShape {
    int64_t max_ctx = 0, max_blocks = 1, rows = 0;
    bool any_long = false;
  };
  StepShape validate_step(const Step& st, const PagedKvCache& cache, int64_t layers_needed) const;
  // What a graph runs: a decode or verify step of the main model (Model::step), or a pass of the MTP draft step
  // that gathers its hidden rows from the last step's head-input rows (the first) or from the previous pass's
  // normed rows (the later ones): the two read different buffers, so each has graphs of its own.
  // DraftStep: every pass of a draft step in one graph (draft_step_graph).
  enum class GraphKind : uint8_t { Step, DraftFromStep, DraftFromDraft, DraftStep };
  // The graph shape of a step: B sequences of T tokens each (B = 0: the step runs eagerly), or, for a first draft
  // pass whose sequences fill different numbers of slots (ragged), T = 0 and its B sequences of `tokens` tokens in
  // all, unpadded. A DraftStep graph also has its number of passes, the padded sequences of its later passes (one
  // slot each) and the first pass that runs the DSA selection (passes: none).
  struct GraphShape {
    int64_t B = 0, T = 0;
    int64_t tokens = 0;
    int64_t passes = 1, B_later = 0, long_from = 0;
    bool operator==(const GraphShape&) const = default;
  };
  // The graph a step runs in (B = 0: eagerly): graphs on and supported, a single rank, no diagnostics, every
  // sequence a decode sequence of the same T tokens wanting the rows `kind` records (a step: its last row, or every
  // row of a verify step; a draft pass: its last row), within the reserve() limits at graph_seqs_for(S, T); a first
  // draft pass's sequences may fill different numbers of slots (a ragged graph: T = 0, unpadded).
  GraphShape graph_shape(const Step& st, const StepShape& sh, GraphKind kind) const;
  GraphShape graph_eligible(const Step& st, const StepShape& sh, const float* logits,
                            const std::vector<float>* hidden) const;
  void graph_step(const Step& st, PagedKvCache& cache, float* logits, const StepShape& sh, GraphShape g);
  // A step padded to a graph's B sequences (pad_graph_step): its tokens, sequences, draft hidden rows, and its shape
  // at the reserved context and block-table width.
  struct PadStep {
    std::vector<int32_t> tokens, hrows;
    std::vector<StepSequence> seqs;
    Step step;
    StepShape shape;
  };
  void pad_graph_step(const Step& st, const StepShape& sh, GraphShape g, std::span<const int32_t> mtp_hrows,
                      int32_t pad_hrow, PadStep& p) const;
  // Carves the workspace at the graph's fixed shape (B · T tokens, B sequences, the reserved context and block-table
  // width) and uploads the metadata of the step padded to B sequences (stage_step; padding hidden rows: pad_hrow).
  Meta stage_graph_step(const Step& st, const PagedKvCache& cache, const StepShape& sh, GraphShape g, Buffers& b,
                        std::span<const int32_t> mtp_hrows = {}, int32_t pad_hrow = 0);
  // Runs body() (the ops of a step staged by stage_graph_step) from the graph of its key; returns whether it was
  // replayed (model_internal.h).
  template <class Body>
  bool run_graph(GraphKind kind, GraphShape g, bool any_long, const PagedKvCache& cache, Body&& body);
  void keep_graphs_valid(const PagedKvCache& cache);  // drops them when a buffer they recorded has moved
  int64_t graph_kernels_of(bool draft, int64_t seqs, int64_t rows_per_seq) const;
  void drop_graphs();
  void drop_graphs_of(GraphKind kind);
  bool ragged_graph_allowed(GraphKind kind, const GraphShape& g, bool any_long) const;
  // Carves the workspace for the step and uploads its metadata (tokens, positions, slots, block tables, rows; for
  // an MTP draft pass also the hidden rows it gathers, one per token, and the concat's row order) in one copy.
  // Sequences from n_real on are a graph's padding (stage_graph_step): their tokens sit at position 0 over one key
  // (the first key of their block table) and are not stored (slot -1).
  Meta stage_step(const Step& st, const PagedKvCache& cache, const StepShape& sh, Buffers& b,
                  std::span<const int32_t> mtp_hrows = {}, int64_t n_real = -1);
  // Decoder layer l over the step's residual stream b.h: x = norm(h) unless `input_normed` (the previous layer
  // fused it), h += o_proj(attention(x)), x = norm(h), h += ffn(x) — fused with the next norm into x when
  // next_norm is given.
  void decoder_layer(int64_t l, const Meta& m, PagedKvCache& cache, Buffers& b, bool& sparse, bool input_normed,
                     const float* next_norm);
  // MTP: backend buffers for the kept head-input rows ([rows + 1, D], the last row zero) and the draft hidden rows.
  void ensure_mtp_buffers(int64_t rows, int64_t seqs);
  // One pass of the draft step: the MTP layer over `tokens` (slots sseqs), its hidden rows gathered from the last
  // step's head-input rows (from_step) or the previous pass's normed rows; ids [rows] get the greedy drafts.
  void mtp_pass(bool from_step, std::span<const int32_t> hrows, std::span<const int32_t> tokens,
                std::span<const StepSequence> sseqs, PagedKvCache& cache, int32_t* ids, float* logits);
  // The device ops of a draft pass over its staged metadata (graphed or not); the greedy ids go to ids.
  void mtp_ops(const Meta& m, Buffers& b, const void* hidden_src, PagedKvCache& cache, int32_t* ids);
  // The draft step as one graph of all its passes (draft_step_graph); false (nothing run) when it is not eligible.
  bool draft_step_in_one_graph(std::span<const MtpSequence> seqs, PagedKvCache& cache, int32_t* drafts, float* logits);
  struct DraftPass;  // one pass of a draft step on that route (mtp.cpp)
  bool plan_draft_passes(std::span<const MtpSequence> seqs, const PagedKvCache& cache,
                         std::vector<DraftPass>& ps) const;
  int32_t* stage_draft_passes(std::vector<DraftPass>& ps, int64_t Bmax, int64_t n_real, const PagedKvCache& cache,
                              std::vector<Buffers>& bufs, std::vector<Meta>& metas);
  void attention(int64_t l, const Meta& m, PagedKvCache& cache, Buffers& b, bool& sparse);
  // Prompt rows: of n rows from position p0, how many take the naive form (the rest: absorbed).
  int64_t naive_limit() const { return std::max<int64_t>(1, opt_.naive_max_context); }
  int64_t naive_rows(int64_t p0, int64_t n) const {
    if (opt_.attention == AttentionForm::Naive) return n;
    return std::clamp<int64_t>(naive_limit() - p0, 0, n);
  }
  void indexer(int64_t l, const Meta& m, PagedKvCache& cache, Buffers& b, bool& sparse);
  void mlp(const MlpWeights& w, const Tensor& x, int64_t inter, Buffers& b, const Tensor& y);
  // A linear of the forward pass: with ModelOptions::act_fp8_declared and a weight whose checkpoint declares FP8
  // activations (and, with a SwiGLU epilogue, its gate's) through matmul_act_fp8, else matmul.
  void linear(const QuantWeight& w, const Tensor& x, const Tensor& y, const Epilogue& ep = {});
  // The declared-activation argument of the blocks and linear ops (null when off); its scratch is the workspace's.
  const ActFp8* act_fp8() const { return opt_.act_fp8_declared ? &act_fp8_ : nullptr; }
  void moe(int64_t l, const Meta& m, Buffers& b, const Tensor& y);
  const float* upload_vector(const std::vector<float>& v, const char* what);
  void reduce_partial(const Tensor& y, const Tensor& yf);  // all-reduce of a rank's partial sum (yf: F32 staging)
  void download_rows(const Tensor& t, float* dst);         // a contiguous backend tensor to host fp32
  void build_block_args();  // mla_, moe_ from the prepared weights and the uploaded vectors

  struct LayerParams {  // the small per-channel vectors, in backend memory (null when absent)
    const float *input_norm = nullptr, *post_attn_norm = nullptr, *q_a_norm = nullptr, *kv_a_norm = nullptr;
    const float *q_a_bias = nullptr, *kv_a_bias = nullptr, *o_bias = nullptr;
    const float *k_norm_w = nullptr, *k_norm_b = nullptr, *score_bias = nullptr;
  };

  const ModelConfig& cfg_;
  Backend& be_;
  ModelOptions opt_;
  DType act_ = DType::F32;  // the activation dtype of the run (BF16 with bf16_activations)
  ModelWeights w_;
  std::vector<LayerParams> lp_;
  struct MtpParams {  // an MTP layer's norm vectors, in backend memory
    const float *enorm = nullptr, *hnorm = nullptr, *head_norm = nullptr;
  };
  std::vector<MtpParams> mtp_p_;
  void* kept_ = nullptr;  // [kept_cap_ + 1, D] activation dtype: the last step's head-input rows (MTP), a zero row
  int64_t kept_cap_ = 0, kept_rows_ = 0;
  void* mtp_prev_ = nullptr;  // [mtp_prev_cap_, D] activation dtype: the draft step's own normed rows
  int64_t mtp_prev_cap_ = 0;
  int32_t* mtp_ids_dev_ = nullptr;             // [mtp_prev_cap_] draft ids of a pass
  SampleRowParams* mtp_params_dev_ = nullptr;  // [mtp_prev_cap_] greedy rows
  // The decode blocks' view of each layer (backend/backend.h), built once after the weights are prepared.
  std::vector<MlaLayer> mla_;
  std::vector<MoeLayer> moe_;
  ActFp8 act_fp8_;  // scratch = the carved workspace's aq (set by every carve into ws_)
  std::vector<std::vector<const QuantWeight*>> expert_tables_;  // per MoE layer: gate [E], up [E], down [E]
  const float* final_norm_ = nullptr;
  const float* inv_freq_ = nullptr;  // backend memory
  float attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
  std::vector<void*> owned_;  // backend allocations of the model (vectors, workspace)
  char* ws_ = nullptr;
  size_t ws_cap_ = 0;
  int64_t ws_grows_ = 0;
  std::vector<char> stage_host_;  // host image of a step's metadata (stage_step; grow-only)
  RankContext rank_;
  ShardDims sd_;
  ShardStorage shard_store_;
  std::vector<float> host_f32_;  // rank 0: the all-gathered logits before they are laid out as [rows, V]
  // Decode graphs: the reserve() limits they are shaped by, the graph id per bucket, and what they recorded
  // pointers into (a new workspace or KV pool drops them).
  int64_t res_tokens_ = 0, res_seqs_ = 0, res_ctx_ = 0, res_blocks_ = 0;
  struct GraphEntry {
    GraphKind kind = GraphKind::Step;
    GraphShape g;
    bool any_long = false;  // with the DSA selection
    int id = -1;            // backend graph id
  };
  std::vector<GraphEntry> graphs_;
  // Every buffer the graphs recorded pointers into: the workspace, the MTP buffers, every pool's data; and the
  // same list for the step being run (compared, then swapped: no allocation once warm).
  std::vector<const void*> graph_ptrs_, graph_ptrs_now_;
  int64_t graph_captures_ = 0, graph_replays_ = 0;
  int64_t draft_passes_ = 0, draft_graph_captures_ = 0, draft_graph_replays_ = 0;
  int64_t draft_step_graphs_ = 0, draft_passes_replayed_ = 0, draft_id_downloads_ = 0;
  // The one-graph draft step (draft_step_in_one_graph): one backend buffer holding every pass's draft ids
  // [passes, padded sequences] and then every pass's metadata, staged in its host image and uploaded in one copy.
  char* dstep_buf_ = nullptr;
  size_t dstep_cap_ = 0;
  std::vector<char> dstep_host_;
  PadStep pad_;  // the padded step of a graph (stage_graph_step)
  // Sampling on the backend: the batch's arrays in one grow-only backend buffer (params, edits, allow, ids), the
  // banned bitmask uploaded once per distinct list, and the head's output of the step being run.
  void upload_sampling(const SampleBatch& s);
  bool sampling_step_ = false;
  char* smp_buf_ = nullptr;
  size_t smp_cap_ = 0;
  std::vector<char> smp_host_;
  const SampleRowParams* smp_params_ = nullptr;
  const SampleEdit* smp_edits_ = nullptr;
  const uint32_t* smp_allow_ = nullptr;
  int32_t* smp_ids_ = nullptr;
  uint32_t* smp_banned_ = nullptr;
  const std::vector<bool>* smp_banned_src_ = nullptr;
  size_t smp_banned_size_ = 0;
  float* last_lg_ = nullptr;

 public:
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
};

// Everything needed to run a model directory: the mapped checkpoint, its config and precision plan.
struct ModelFiles {
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<ModelConfig> cfg;
  std::unique_ptr<PrecisionPlan> plan;
};
ModelFiles open_model_files(const std::string& dir, const PlanOptions& opt = {});

}  // namespace latent
