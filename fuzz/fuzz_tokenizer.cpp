// libFuzzer target for the tokenizer. The first byte picks a mode:
//   0, 1  encode the rest with the GLM-5 / DeepSeek-V3 test tokenizers: decode(encode(text)) == text for valid
//         UTF-8 (neither has a normalizer; ByteLevel is lossless), and streaming the ids reproduces decode;
//   2     decode arbitrary ids (little-endian int32) with every test tokenizer, skip_special false / true, and
//         check the incremental detokenizer against decode;
//   3     load the rest as a tokenizer.json: a latent::Error is fine, any other exception or crash is a bug.
// Seeds: any text files; the committed tests/data/tokenizer/*/tokenizer.json for mode 3 (prefix a byte 3).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

const latent::Tokenizer& tokenizer(int which) {
  static const latent::Tokenizer glm =
      latent::Tokenizer::from_file(std::string(LATENT_SOURCE_DIR) + "/tests/data/tokenizer/glm5");
  static const latent::Tokenizer ds =
      latent::Tokenizer::from_file(std::string(LATENT_SOURCE_DIR) + "/tests/data/tokenizer/deepseek_v3");
  static const latent::Tokenizer fb =
      latent::Tokenizer::from_file(std::string(LATENT_SOURCE_DIR) + "/tests/data/tokenizer/bytefb");
  return which == 0 ? glm : which == 1 ? ds : fb;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: property violated: %s\n", what);
    std::abort();
  }
}

void check_stream(const latent::Tokenizer& tok, const std::vector<latent::TokenId>& ids, bool skip) {
  latent::IncrementalDetokenizer d(tok, skip);
  std::string acc;
  for (auto id : ids) {
    const std::string piece = d.push(id);
    check(latent::unicode::is_valid_utf8(piece), "streamed piece is valid UTF-8");
    acc += piece;
  }
  acc += d.finish();
  check(acc == tok.decode(ids, skip), "streamed pieces concatenate to decode()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 4;
  const bool flag = (data[0] >> 2) & 1;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (mode) {
    case 0:
    case 1: {
      const latent::Tokenizer& tok = tokenizer(mode);
      latent::EncodeOptions o;
      o.add_special_tokens = false;
      o.split_special_tokens = flag;
      const auto ids = tok.encode(in, o);
      if (latent::unicode::is_valid_utf8(in)) check(tok.decode(ids) == in, "decode(encode(text)) == text");
      check_stream(tok, ids, false);
      o.add_special_tokens = true;
      std::vector<latent::TokenId> want = tok.prefix_ids();
      want.insert(want.end(), ids.begin(), ids.end());
      want.insert(want.end(), tok.suffix_ids().begin(), tok.suffix_ids().end());
      check(tok.encode(in, o) == want, "add_special_tokens adds exactly the post-processor's ids");
      break;
    }
    case 2: {
      std::vector<latent::TokenId> ids;
      for (size_t i = 0; i + 4 <= in.size(); i += 4) {
        int32_t v;
        std::memcpy(&v, in.data() + i, 4);
        ids.push_back(v);
      }
      for (int t = 0; t < 3; ++t) {
        const latent::Tokenizer& tok = tokenizer(t);
        // Mostly valid ids, some past the end and negative.
        std::vector<latent::TokenId> mapped;
        for (auto v : ids)
          mapped.push_back(v < 0 ? v : static_cast<latent::TokenId>(static_cast<uint32_t>(v) % (tok.id_limit() + 16)));
        for (bool skip : {false, true}) {
          const std::string text = tok.decode(mapped, skip);
          check(latent::unicode::is_valid_utf8(text), "decode() is valid UTF-8");
          check_stream(tok, mapped, skip);
        }
      }
      break;
    }
    default: {
      try {
        const latent::Tokenizer tok = latent::Tokenizer::from_json(in, "fuzz/tokenizer.json");
        const auto ids = tok.encode("Hello, world! 123 \xE4\xBD\xA0\xE5\xA5\xBD <|user|>", true);
        (void)tok.decode(ids, false);
      } catch (const latent::Error&) {
        // Rejected with a clear error: fine.
      }
      break;
    }
  }
  return 0;
}
