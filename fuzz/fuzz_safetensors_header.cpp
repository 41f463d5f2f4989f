// libFuzzer target: the input is a whole safetensors file image (u64 LE header length, JSON header, data region).
// A malformed input must give exactly one latent::Error with a one-line message naming the file; a valid one
// must satisfy every invariant the reader promises (spans inside the data region, sizes match, no overlaps).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"

namespace {

const std::string kFile = "fuzz.safetensors";

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_valid(const latent::SafetensorsLayout& l, uint64_t size) {
  const uint64_t data_size = size - l.data_offset;
  std::vector<const latent::TensorInfo*> spans;
  for (const auto& t : l.header.tensors) {
    if (t.begin > t.end || t.end > data_size) broken("span outside the data region", t.name);
    auto need = latent::dtype_storage_bytes(t.dtype, static_cast<uint64_t>(t.shape.numel()));
    if (!need || *need != t.end - t.begin) broken("byte size mismatch", t.name);
    if (t.end > t.begin) spans.push_back(&t);
  }
  std::sort(spans.begin(), spans.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i]->begin < spans[i - 1]->end) broken("overlapping spans", spans[i]->name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check_valid(latent::parse_safetensors_bytes(data, size, kFile), size);
  } catch (const latent::Error& e) {
    const std::string msg = e.what();
    if (msg.find('\n') != std::string::npos) broken("multi-line message", msg);
    if (msg.rfind(kFile + ": ", 0) != 0) broken("message does not start with the file name", msg);
  }
  return 0;
}
