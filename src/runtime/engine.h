// Engine: what the scheduler needs from a model — per-sequence state (the KV cache) and one forward step over a
// batch of (sequence, token chunk) items. The CPU implementation over latent::Model lives in server/model_engine;
// tests use a fake. Called only from the scheduler thread.
#pragma once
#include <cstdint>
#include <span>

namespace latent {

using SeqId = int64_t;

struct EngineStepItem {
  SeqId seq = -1;
  std::span<const int32_t> tokens;  // appended at the sequence's next positions (1 token when decoding)
  bool want_logits = false;         // the logits of the last token of this chunk are needed
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Width of a logits row (config.json vocab_size: may exceed the tokenizer's ids).
  virtual int64_t vocab_size() const = 0;
  // Bytes one token occupies in a sequence's cache (all layers): sizes the KV block budget.
  virtual int64_t kv_bytes_per_token() const = 0;
  // Creates empty state for a new sequence id.
  virtual void add_sequence(SeqId seq) = 0;
  // Frees a sequence's state (its cache memory). Unknown ids are ignored.
  virtual void remove_sequence(SeqId seq) = 0;
  // `to` (already added, empty) gets a copy of `from`'s cache: the prompt of an n > 1 request is computed once.
  virtual void fork_sequence(SeqId from, SeqId to) = 0;
  // Runs every item. logits: one row of vocab_size() floats per item with want_logits, in item order.
  // Throws on failure (the scheduler aborts the requests of the batch).
  virtual void step(std::span<const EngineStepItem> items, float* logits) = 0;
};

}  // namespace latent
