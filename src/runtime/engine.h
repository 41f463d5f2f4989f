// Engine: what the scheduler needs from a model — one forward step over a batch of (sequence, token chunk) items,
// each writing its tokens' KV into the blocks the scheduler's allocator (runtime/kv_blocks.h) gave it. The engine
// keeps no per-sequence state: the block pool is the cache, the block table says where a sequence lives.
// The implementation over latent::Model lives in server/model_engine; tests use a fake. Called only from the
// scheduler thread.
#pragma once
#include <cstdint>
#include <span>
#include <stdexcept>

#include "backend/sampling.h"

namespace latent {

using SeqId = int64_t;

struct EngineStepItem {
  SeqId seq = -1;
  std::span<const int32_t> tokens;  // appended at positions start .. start + tokens.size() - 1
  int64_t start = 0;                // tokens of this sequence already in the cache
  std::span<const int32_t> blocks;  // its block table, covering start + tokens.size() tokens
  bool want_logits = false;         // the logits of the last token of this chunk are needed
  bool all_logits = false;          // the logits of every token of this chunk are needed (prompt logprobs)
  bool decode = false;              // the tokens are generated ones (not the prompt): decode-form attention
};

// One sequence of a draft step (speculative decoding with a multi-token-prediction layer; model/model.h
// MtpSequence has the semantics): the draft layer's slots start .. start + tokens.size() - 1 are written from the
// hidden rows of the last step() (slot start + i from row hidden_row + i of that step's flat token order, or a zero
// vector for slot `start` with zero_first), then n_draft tokens are proposed after the last slot.
struct EngineDraftItem {
  SeqId seq = -1;
  int64_t start = 0;
  std::span<const int32_t> tokens;  // the token at each slot (>= 1)
  int64_t hidden_row = 0;
  bool zero_first = false;
  std::span<const int32_t> blocks;  // block table covering start + tokens.size() + max(n_draft - 1, 0) slots
  int32_t n_draft = 0;
  bool decode = true;  // the slots come from generated tokens (decode-form attention)
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Width of a logits row (config.json vocab_size: may exceed the tokenizer's ids).
  virtual int64_t vocab_size() const = 0;
  // Bytes one token occupies in the cache (all layers).
  virtual int64_t kv_bytes_per_token() const = 0;
  // Copies the first n_tokens slots of block src into block dst (copy on write of a shared partial block).
  virtual void copy_block(int32_t src, int32_t dst, int64_t n_tokens) = 0;
  // Runs every item in one batched step. logits: rows of vocab_size() floats in item order: tokens.size() rows for
  // an item with all_logits (one per token, in order; the last is the want_logits row), else one row per item with
  // want_logits. Throws on failure (the scheduler aborts the requests of the batch).
  virtual void step(std::span<const EngineStepItem> items, float* logits) = 0;
  // True when step_sampled() can sample the logits rows where the engine computes them (on its device), so that
  // only the ids come back.
  virtual bool samples_on_device() const { return false; }
  // step() that samples instead of returning logits: `sampling` has one row per logits row (the rows step() would
  // write, in the same order; Backend::sample_rows semantics) and ids gets one token per row.
  virtual void step_sampled(std::span<const EngineStepItem> items, const SampleBatch& sampling, int32_t* ids) {
    throw std::logic_error("this engine does not sample on its device");
  }
  // True when a failed step left the engine unusable (a lost GPU context): no later step can succeed.
  virtual bool lost() const { return false; }
  // Speculative decoding: draft layers the engine runs (0: none; the scheduler then never drafts).
  virtual int64_t draft_layers() const { return 0; }
  // After a step() / step_sampled(): writes the draft layer's slots of `items` from that step's rows and proposes
  // n_draft tokens per item (greedy), in item order into drafts. Only the ids cross to the host. Throws on failure.
  virtual void draft(std::span<const EngineDraftItem> items, int32_t* drafts) {
    throw std::logic_error("this engine has no draft layer");
  }
};

}  // namespace latent
