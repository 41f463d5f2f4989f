// The decode workload the model benches share (cuda_bench decode, parallel_bench): `batch` sequences with
// `prompt`-token prompts, each in its own run of consecutive blocks of a paged pool, then greedy single-token
// steps. Drive it with any step function: prefill() once, then next() per decode step.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace latent::bench {

struct DecodeBatch {
  int64_t vocab, batch, prompt, block_tokens, blocks_per_seq;
  std::vector<std::vector<int32_t>> blocks;
  std::vector<StepSequence> seqs;
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [batch, vocab]: the last step's rows

  // ctx: the most tokens a sequence will hold (prompt + decode steps).
  DecodeBatch(int64_t vocab_size, int64_t n, int64_t prompt_tokens, int64_t ctx, int64_t bt)
      : vocab(vocab_size),
        batch(n),
        prompt(prompt_tokens),
        block_tokens(bt),
        blocks_per_seq((ctx + bt - 1) / bt),
        blocks(static_cast<size_t>(n)),
        seqs(static_cast<size_t>(n)),
        logits(static_cast<size_t>(n * vocab_size)) {
    for (int64_t s = 0; s < batch; ++s) {
      for (int64_t j = 0; j < blocks_per_seq; ++j) blocks[s].push_back(static_cast<int32_t>(s * blocks_per_seq + j));
      for (int64_t t = 0; t < prompt; ++t) tokens.push_back(static_cast<int32_t>((s * 7919 + t * 31 + 13) % vocab));
      seqs[s].n_tokens = prompt;
      seqs[s].blocks = blocks[s];
    }
  }
  int64_t pool_blocks() const { return batch * blocks_per_seq; }
  // The prompt step (every sequence's whole prompt in one step).
  Step prefill() const { return Step{tokens, seqs}; }
  // The next decode step: each sequence's greedy token from the last step's logits.
  Step next() {
    tokens.assign(static_cast<size_t>(batch), 0);
    for (int64_t s = 0; s < batch; ++s) {
      const float* row = logits.data() + s * vocab;
      tokens[s] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      seqs[s].start += seqs[s].n_tokens;
      seqs[s].n_tokens = 1;
      seqs[s].decode = true;
    }
    return Step{tokens, seqs};
  }
};

}  // namespace latent::bench
