// Test support: token ids stored in KV block slots the way a real engine stores the latent cache, so that fake
// engines exercise the scheduler's block tables for real (sharing between choices, copy of a partial block,
// preemption and release). Reading a slot that was never written is a bug in the block bookkeeping: it throws.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"

namespace latent::testing {

struct FakePagedStore {
  int64_t block_tokens = 64;
  std::unordered_map<int64_t, int32_t> slot_token;

  int64_t slot(const EngineStepItem& it, int64_t pos) const {
    const int64_t b = pos / block_tokens;
    if (b >= static_cast<int64_t>(it.blocks.size()))
      throw std::runtime_error("fake engine: position " + std::to_string(pos) + " is outside the block table");
    return static_cast<int64_t>(it.blocks[static_cast<size_t>(b)]) * block_tokens + pos % block_tokens;
  }
  // Writes the item's tokens into their slots; returns the sequence's whole history read back through its blocks.
  std::vector<int32_t> apply(const EngineStepItem& it) {
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    for (int64_t i = 0; i < n; ++i) slot_token[slot(it, it.start + i)] = it.tokens[static_cast<size_t>(i)];
    std::vector<int32_t> h;
    for (int64_t p = 0; p < it.start + n; ++p) {
      auto f = slot_token.find(slot(it, p));
      if (f == slot_token.end())
        throw std::runtime_error("fake engine: position " + std::to_string(p) + " reads a slot never written");
      h.push_back(f->second);
    }
    return h;
  }
  void copy_block(int32_t src, int32_t dst, int64_t n_tokens) {
    for (int64_t i = 0; i < n_tokens; ++i) {
      auto f = slot_token.find(static_cast<int64_t>(src) * block_tokens + i);
      if (f == slot_token.end()) throw std::runtime_error("fake engine: copying a slot never written");
      slot_token[static_cast<int64_t>(dst) * block_tokens + i] = f->second;
    }
  }
};

}  // namespace latent::testing
