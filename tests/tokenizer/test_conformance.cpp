// Token-for-token conformance with PyPI `tokenizers` on the committed fixtures (tools/gen_tokenizer_fixtures.py):
// encode with add_special_tokens false / true and with split_special_tokens, decode with skip false / true.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fixtures.h"
#include "tokenizer/tokenizer.h"

namespace latent {
namespace {

using test::fixture_lines;
using test::fixture_tokenizer;

std::string show(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

// Empty when equal; otherwise where the first difference is.
std::string diff_ids(const std::vector<TokenId>& got, const std::vector<TokenId>& want) {
  if (got == want) return {};
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::string s = "first mismatch at index " + std::to_string(i) + ": got ";
  s += i < got.size() ? std::to_string(got[i]) : "<end>";
  s += " want ";
  s += i < want.size() ? std::to_string(want[i]) : "<end>";
  s += " (got " + std::to_string(got.size()) + " ids, want " + std::to_string(want.size()) + ")";
  return s;
}

std::string diff_text(const std::string& got, const std::string& want) {
  if (got == want) return {};
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return "first differing byte at " + std::to_string(i) + ": got " + show(got) + " want " + show(want);
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, Encode) {
  const Tokenizer& tok = fixture_tokenizer(GetParam());
  const auto& lines = fixture_lines(GetParam(), "encode.jsonl");
  ASSERT_GT(lines.size(), 300u);
  ASSERT_TRUE(lines[0].contains("meta"));
  int failures = 0;
  for (size_t k = 1; k < lines.size() && failures < 10; ++k) {
    const auto& c = lines[k];
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<TokenId>>();
    const auto want_sp = c.contains("ids_special") ? c["ids_special"].get<std::vector<TokenId>>() : want;
    const auto want_split = c.contains("ids_split") ? c["ids_split"].get<std::vector<TokenId>>() : want;
    const std::string label =
        "case " + std::to_string(k) + " text " + show(text.size() > 200 ? text.substr(0, 200) : text);
    std::string d = diff_ids(tok.encode(text, false), want);
    if (!d.empty()) ++failures;
    EXPECT_EQ(d, "") << GetParam() << " encode(add_special_tokens=False) " << label;
    d = diff_ids(tok.encode(text, true), want_sp);
    if (!d.empty()) ++failures;
    EXPECT_EQ(d, "") << GetParam() << " encode(add_special_tokens=True) " << label;
    EncodeOptions o;
    o.add_special_tokens = false;
    o.split_special_tokens = true;
    d = diff_ids(tok.encode(text, o), want_split);
    if (!d.empty()) ++failures;
    EXPECT_EQ(d, "") << GetParam() << " encode(split_special_tokens) " << label;
  }
}

TEST_P(Conformance, Decode) {
  const Tokenizer& tok = fixture_tokenizer(GetParam());
  const auto& lines = fixture_lines(GetParam(), "decode.jsonl");
  ASSERT_GT(lines.size(), 100u);
  int failures = 0;
  for (size_t k = 1; k < lines.size() && failures < 10; ++k) {
    const auto& c = lines[k];
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    std::string d = diff_text(tok.decode(ids, false), c["text"].get<std::string>());
    if (!d.empty()) ++failures;
    EXPECT_EQ(d, "") << GetParam() << " decode(skip=False) case " << k << " ids " << c["ids"].dump();
    d = diff_text(tok.decode(ids, true), c["text_skip"].get<std::string>());
    if (!d.empty()) ++failures;
    EXPECT_EQ(d, "") << GetParam() << " decode(skip=True) case " << k << " ids " << c["ids"].dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Conformance, ::testing::Values("glm5", "deepseek_v3", "kimi_k2", "bytefb"));

// The test tokenizers with one component swapped (variants.jsonl): pre-tokenizers, normalizers and decoders that
// the model families above do not use.
TEST(ConformanceVariants, SwappedComponents) {
  std::ifstream f(std::string(LATENT_SOURCE_DIR) + "/tests/data/tokenizer/variants.jsonl");
  ASSERT_TRUE(f.good());
  std::map<std::string, nlohmann::json> bases;
  std::unique_ptr<Tokenizer> tok;
  std::string variant;
  int cases = 0, failures = 0, variants = 0;
  std::string line;
  std::getline(f, line);  // meta
  while (std::getline(f, line) && failures < 10) {
    const auto c = nlohmann::json::parse(line);
    if (c.contains("patch")) {
      variant = c["variant"].get<std::string>();
      const std::string base = c["base"].get<std::string>();
      if (!bases.count(base)) {
        std::ifstream bf(test::tokenizer_dir(base) + "/tokenizer.json");
        bases[base] = nlohmann::json::parse(bf);
      }
      nlohmann::json j = bases[base];
      for (auto it = c["patch"].begin(); it != c["patch"].end(); ++it) j[it.key()] = it.value();
      tok = std::make_unique<Tokenizer>(Tokenizer::from_parsed(j, variant));
      ++variants;
      continue;
    }
    ++cases;
    if (c.contains("text") && !c.contains("text_skip")) {
      const std::string text = c["text"].get<std::string>();
      const std::string d = diff_ids(tok->encode(text, false), c["ids"].get<std::vector<TokenId>>());
      if (!d.empty()) ++failures;
      EXPECT_EQ(d, "") << variant << " encode " << show(text);
    } else {
      const auto ids = c["ids"].get<std::vector<TokenId>>();
      std::string d = diff_text(tok->decode(ids, false), c["text"].get<std::string>());
      d += diff_text(tok->decode(ids, true), c["text_skip"].get<std::string>());
      if (!d.empty()) ++failures;
      EXPECT_EQ(d, "") << variant << " decode " << c["ids"].dump();
    }
  }
  EXPECT_EQ(variants, 13);
  EXPECT_GT(cases, 1000);
}

}  // namespace
}  // namespace latent
