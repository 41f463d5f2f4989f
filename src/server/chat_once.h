// One conversation through the serving path (chat template, scheduler, sampler, reasoning / tool parsing), for
// `latent run --chat TEXT`: prints the reasoning (dimmed on a terminal) and the answer as they stream.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "server/serving_model.h"

namespace latent::server {

struct ChatOnceOptions {
  std::string text;        // the user message
  std::string system;      // optional system message
  int64_t max_tokens = 0;  // 0: up to the context
  std::optional<double> temperature;
  std::optional<int64_t> seed;
  std::optional<bool> enable_thinking;
  bool show_reasoning = true;
  bool ignore_eos = false;
  bool host_sampling = false;  // sample the logits on the host even where the engine could on its device
};

// Returns the finish reason. Throws latent::Error on bad input (template failure, context length...).
std::string run_chat_once(LoadedModel& model, const ChatOnceOptions& opt, std::FILE* out = stdout);

}  // namespace latent::server
