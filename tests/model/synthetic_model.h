// Synthetic tiny checkpoints for engine-internal tests: writes config.json + model.safetensors (random weights,
// fixed seed) in a fresh temp directory, with the real HF tensor names (docs/model.md §tensors).
#pragma once
#include <cstdint>
#include <string>

namespace latent::testing {

struct SyntheticSpec {
  std::string arch = "glm";  // "glm" | "v32" | "v3"
  uint64_t seed = 1;
  bool bf16_weights = false;  // Linear weights stored bf16 (else f32)
  int64_t index_topk = 8;
  int64_t index_n_heads = 16;
  bool yarn = true;
};

// Returns the directory (removed by the caller or left in the temp dir).
std::string write_synthetic_model(const SyntheticSpec& spec);

}  // namespace latent::testing
