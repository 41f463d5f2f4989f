// IncrementalDetokenizer (docs/tokenizer.md §decoding): pieces are valid UTF-8 and never end inside a character; their
// concatenation equals decode(all ids) for any split; the listed edge cases.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fixtures.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace latent {
namespace {

const Tokenizer& load(const std::string& name) { return test::fixture_tokenizer(name); }

// Id sequences to stream: encodings of the fixture texts plus the decode fixtures' id lists.
std::vector<std::vector<TokenId>> id_lists(const std::string& name) {
  std::vector<std::vector<TokenId>> out;
  for (const char* f : {"encode.jsonl", "decode.jsonl"}) {
    const auto& lines = test::fixture_lines(name, f);
    for (size_t k = 1; k < lines.size(); ++k) {
      auto ids = lines[k]["ids"].get<std::vector<TokenId>>();
      if (ids.size() <= 300) out.push_back(std::move(ids));
    }
  }
  return out;
}

// Streams ids with a detokenizer; returns the pieces.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<TokenId>& ids, bool skip) {
  IncrementalDetokenizer d(tok, skip);
  std::vector<std::string> pieces;
  for (TokenId id : ids) pieces.push_back(d.push(id));
  pieces.push_back(d.finish());
  return pieces;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& p : v) s += p;
  return s;
}

class StreamProperty : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamProperty, ConcatenationEqualsDecode) {
  const Tokenizer& tok = load(GetParam());
  std::mt19937 rng(7);
  const auto lists = id_lists(GetParam());
  ASSERT_GT(lists.size(), 500u);
  int failures = 0;
  for (size_t k = 0; k < lists.size() && failures < 5; ++k) {
    const auto& ids = lists[k];
    for (bool skip : {false, true}) {
      const auto pieces = stream(tok, ids, skip);
      const std::string want = tok.decode(ids, skip);
      const std::string got = join(pieces);
      if (got != want) ++failures;
      EXPECT_EQ(got, want) << GetParam() << " list " << k << " skip " << skip;
      for (const auto& p : pieces) EXPECT_TRUE(unicode::is_valid_utf8(p)) << "piece is not valid UTF-8";
    }
    // A detokenizer reused after finish() and fed random garbage ids (unknown, past the vocab).
    std::vector<TokenId> noisy = ids;
    for (int r = 0; r < 3; ++r)
      noisy.insert(noisy.begin() + static_cast<long>(rng() % (noisy.size() + 1)),
                   static_cast<TokenId>(tok.id_limit() + rng() % 100));
    EXPECT_EQ(join(stream(tok, noisy, false)), tok.decode(noisy, false));
  }
}

// Tokenizers with a ByteLevel decoder (bytefb uses byte fallback instead).
class ByteLevelStream : public ::testing::TestWithParam<std::string> {};

TEST_P(ByteLevelStream, PiecesNeverSplitACharacter) {
  const Tokenizer& tok = load(GetParam());
  ASSERT_TRUE(tok.byte_level_decoder());
  // Every piece is exactly the lossy decoding of a prefix of the bytes: no piece may end in a U+FFFD that a
  // later byte would have completed, so the running concatenation is always a prefix of the final text.
  for (const auto& ids : id_lists(GetParam())) {
    const std::string full = tok.decode(ids, false);
    IncrementalDetokenizer d(tok);
    std::string acc;
    for (TokenId id : ids) {
      acc += d.push(id);
      ASSERT_EQ(full.compare(0, acc.size(), acc), 0) << "streamed text is not a prefix of decode()";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, StreamProperty, ::testing::Values("glm5", "deepseek_v3", "kimi_k2", "bytefb"));
INSTANTIATE_TEST_SUITE_P(Tokenizers, ByteLevelStream, ::testing::Values("glm5", "deepseek_v3", "kimi_k2"));

// ids of the ByteLevel characters of raw bytes (one token per byte).
std::vector<TokenId> byte_ids(const Tokenizer& tok, std::initializer_list<int> bytes) {
  std::vector<TokenId> out;
  for (int b : bytes) {
    std::string ch;
    // ByteLevel: bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves, others to U+0100 + rank.
    uint32_t cp = static_cast<uint32_t>(b);
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
      uint32_t n = 0;
      for (int x = 0; x < b; ++x)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
      cp = 0x100 + n;
    }
    unicode::append_utf8(ch, cp);
    auto id = tok.token_to_id(ch);
    EXPECT_TRUE(id.has_value()) << "no token for byte " << b;
    out.push_back(id.value_or(0));
  }
  return out;
}

TEST(Detokenizer, CjkCharacterSplitOverThreeTokens) {
  const Tokenizer& tok = load("glm5");
  const auto ids = byte_ids(tok, {0xE4, 0xB8, 0xAD});  // U+4E2D
  IncrementalDetokenizer d(tok);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.push(ids[2]), "\xE4\xB8\xAD");
  EXPECT_EQ(d.finish(), "");
}

TEST(Detokenizer, EmojiSplitOverFourTokens) {
  const Tokenizer& tok = load("deepseek_v3");
  const auto ids = byte_ids(tok, {0xF0, 0x9F, 0x98, 0x80});  // U+1F600
  IncrementalDetokenizer d(tok);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(d.push(ids[i]), "") << i;
  EXPECT_EQ(d.push(ids[3]), "\xF0\x9F\x98\x80");
}

TEST(Detokenizer, SpecialTokenInsideACharacter) {
  const Tokenizer& tok = load("glm5");
  auto ids = byte_ids(tok, {0xE4, 0xB8, 0xAD});
  const TokenId user = tok.token_to_id("<|user|>").value();
  ASSERT_TRUE(tok.is_special(user));
  const std::vector<TokenId> seq = {ids[0], ids[1], user, ids[2]};
  {
    IncrementalDetokenizer d(tok, false);
    EXPECT_EQ(d.push(seq[0]), "");
    EXPECT_EQ(d.push(seq[1]), "");
    EXPECT_EQ(d.push(seq[2]), "\xEF\xBF\xBD<|user|>");
    EXPECT_EQ(d.push(seq[3]), "\xEF\xBF\xBD");
    EXPECT_EQ(tok.decode(seq, false), "\xEF\xBF\xBD<|user|>\xEF\xBF\xBD");
  }
  {
    IncrementalDetokenizer d(tok, true);
    EXPECT_EQ(d.push(seq[0]), "");
    EXPECT_EQ(d.push(seq[1]), "");
    EXPECT_EQ(d.push(seq[2]), "");
    EXPECT_EQ(d.push(seq[3]), "\xE4\xB8\xAD");
    EXPECT_EQ(tok.decode(seq, true), "\xE4\xB8\xAD");
  }
}

TEST(Detokenizer, NonSpecialAddedTokenStaysWhenSkipping) {
  const Tokenizer& tok = load("glm5");
  const TokenId think = tok.token_to_id("<think>").value();
  EXPECT_FALSE(tok.is_special(think));
  IncrementalDetokenizer d(tok, true);
  EXPECT_EQ(d.push(think), "<think>");
}

TEST(Detokenizer, RealReplacementCharacterAndInvalidBytes) {
  const Tokenizer& tok = load("glm5");
  const auto fffd = byte_ids(tok, {0xEF, 0xBF, 0xBD});
  IncrementalDetokenizer d(tok);
  EXPECT_EQ(d.push(fffd[0]), "");
  EXPECT_EQ(d.push(fffd[1]), "");
  EXPECT_EQ(d.push(fffd[2]), "\xEF\xBF\xBD");
  // Bytes that can never complete are replaced at once.
  const auto bad = byte_ids(tok, {0x80, 0xFF, 0xC0, 0x41});
  EXPECT_EQ(d.push(bad[0]), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(bad[1]), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(bad[2]), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(bad[3]), "A");
  // A truncated character at the end is flushed by finish().
  const auto trunc = byte_ids(tok, {0xE4, 0xB8});
  EXPECT_EQ(d.push(trunc[0]), "");
  EXPECT_EQ(d.push(trunc[1]), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
}

TEST(Detokenizer, UnknownIdsProduceNothing) {
  const Tokenizer& tok = load("glm5");
  IncrementalDetokenizer d(tok);
  EXPECT_EQ(d.push(static_cast<TokenId>(tok.id_limit())), "");
  EXPECT_EQ(d.push(-5), "");
  EXPECT_EQ(d.push(1 << 30), "");
  EXPECT_EQ(d.finish(), "");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{-1, 1 << 30}), "");
}

TEST(Detokenizer, WindowModeForByteFallbackDecoder) {
  const Tokenizer& tok = load("bytefb");
  ASSERT_FALSE(tok.byte_level_decoder());
  const std::string text = " caf\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87 done";
  const auto ids = tok.encode(text, false);
  const auto pieces = stream(tok, ids, false);
  EXPECT_EQ(join(pieces), tok.decode(ids, false));
  for (const auto& p : pieces) EXPECT_TRUE(unicode::is_valid_utf8(p));
}

}  // namespace
}  // namespace latent
