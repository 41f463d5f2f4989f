// UTF-8 repair, streaming hold-back, the ByteLevel map, the Oniguruma -> PCRE2 translation, BPE merge order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace latent {
namespace {

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

TEST(Utf8, LossyMatchesPythonReplace) {
  // Expected values: bytes(...).decode("utf-8", "replace") in CPython.
  EXPECT_EQ(unicode::utf8_lossy(""), "");
  EXPECT_EQ(unicode::utf8_lossy("abc"), "abc");
  EXPECT_EQ(unicode::utf8_lossy("\xE4\xB8"), R);
  EXPECT_EQ(unicode::utf8_lossy("\xE4\xB8\xAD"), "\xE4\xB8\xAD");
  EXPECT_EQ(unicode::utf8_lossy("\xE4\x41"), R + "A");
  EXPECT_EQ(unicode::utf8_lossy("\xF0\x9F\x98"), R);
  EXPECT_EQ(unicode::utf8_lossy("\xC0\xAF"), R + R);
  EXPECT_EQ(unicode::utf8_lossy("\xED\xA0\x80"), R + R + R);
  EXPECT_EQ(unicode::utf8_lossy("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(unicode::utf8_lossy("\xE0\x80\xAF"), R + R + R);
  EXPECT_EQ(unicode::utf8_lossy("\xFF\xFE"), R + R);
  EXPECT_EQ(unicode::utf8_lossy("\x80x\xBF"), R + "x" + R);
  EXPECT_EQ(unicode::utf8_lossy("\xF1\x80\x80\xE1\x80\xC2"), R + R + R);
  EXPECT_EQ(unicode::utf8_lossy(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_TRUE(unicode::is_valid_utf8("\xF0\x9F\x98\x80 \xE4\xB8\xAD"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xED\xA0\x80"));
  EXPECT_FALSE(unicode::is_valid_utf8("aaaaaaaaaaaaaaaa\xC3"));
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(unicode::incomplete_utf8_tail(""), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xE4"), 1u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xE4\xB8"), 2u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("\xE0\x80"), 0u);  // can never complete
  EXPECT_EQ(unicode::incomplete_utf8_tail("\xED\xA0"), 0u);  // surrogate
  EXPECT_EQ(unicode::incomplete_utf8_tail("\xC0"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("\x80"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("\xE4\x41"), 0u);
}

TEST(ByteLevel, Map) {
  EXPECT_EQ(byte_level::byte_to_cp(' '), 0x120u);
  EXPECT_EQ(byte_level::byte_to_cp('\n'), 0x10Au);
  EXPECT_EQ(byte_level::byte_to_cp('\t'), 0x109u);
  EXPECT_EQ(byte_level::byte_to_cp(0xAD), 0x143u);
  EXPECT_EQ(byte_level::byte_to_cp('A'), static_cast<uint32_t>('A'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(byte_level::cp_to_byte(byte_level::byte_to_cp(static_cast<uint8_t>(b))), b);
  std::string mapped;
  byte_level::encode("a b\n", mapped);
  EXPECT_EQ(mapped,
            "a\xC4\xA0"
            "b\xC4\x8A");
  EXPECT_EQ(byte_level::decode(mapped), "a b\n");
  EXPECT_FALSE(byte_level::decode("\xEF\xBD\x9C").has_value());  // U+FF5C is not in the map
}

std::vector<std::string> matches(const std::string& pattern, const std::string& text) {
  Regex re(pattern);
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all(text, m);
  std::vector<std::string> out;
  for (auto [b, e] : m) out.push_back(text.substr(b, e - b));
  return out;
}

using V = std::vector<std::string>;

TEST(Regex, OnigurumaSemantics) {
  // Ruby syntax: \h is a hex digit, (?m) is dot-all, ^ and $ are line anchors, \u is a code point.
  EXPECT_EQ(matches(R"(\h+)", "xx 0f9 zz"), V({"0f9"}));
  EXPECT_EQ(matches(R"((?m)a.b)", "a\nb"), V({"a\nb"}));
  EXPECT_EQ(matches("^a", "a\na a"), V({"a", "a"}));
  EXPECT_EQ(matches("a$", "a\na a"), V({"a", "a"}));
  EXPECT_EQ(matches(R"(\u0041)", "xAx"), V({"A"}));
  EXPECT_EQ(matches(R"(\v)",
                    "a\x0B"
                    "b\n"),
            V({"\x0B"}));
  // Class intersection and nesting.
  EXPECT_EQ(matches(R"([\p{L}&&[^a-c]]+)", "abcdefgABC"), V({"defgABC"}));
  EXPECT_EQ(matches(R"([a-c[x-z]]+)", "abxyzq"), V({"abxyz"}));
  EXPECT_EQ(matches(R"([\p{Lu}\p{Lo}&&[^\p{Han}]]+)",
                    "AB\xE4\xB8\xAD"
                    "C\xE3\x81\x82"),
            V({"AB", "C\xE3\x81\x82"}));
  // Unicode case folding: (?i:'s) matches 'S and the long s.
  EXPECT_EQ(matches(R"((?i:'s|'t))", "'S 'T '\xC5\xBF 'K"), V({"'S", "'T", "'\xC5\xBF"}));
  // \s is White_Space: NEL, NBSP, U+3000 yes; ZWSP, BOM, U+001C no.
  EXPECT_EQ(matches(R"(\s+)",
                    "a\xC2\x85"
                    "b\xC2\xA0"
                    "c\xE3\x80\x80"
                    "d\xE2\x80\x8B"
                    "e\xEF\xBB\xBF"
                    "f\x1C"
                    "g"),
            V({"\xC2\x85", "\xC2\xA0", "\xE3\x80\x80"}));
  // Backtracking: \s+(?!\S) leaves one space before a word.
  EXPECT_EQ(matches(R"(\s+(?!\S)|\s+|\S+)", "a   b"), V({"a", "  ", " ", "b"}));
  // Empty matches: one per position, none right after a match.
  EXPECT_EQ(matches("a*", "baac"), V({"", "aa", ""}));
}

TEST(Regex, TranslationErrors) {
  EXPECT_THROW(Regex("[[:alpha:]]"), Error);
  EXPECT_THROW(Regex("[abc"), Error);
  EXPECT_THROW(Regex("(ab"), Error);
  EXPECT_THROW(Regex(R"(\p{NotAProperty})"), Error);
  EXPECT_THROW(Regex("[z-a]"), Error);
  EXPECT_THROW(Regex("\xFF"), Error);
}

TEST(Regex, PropertyTablesFollowTheReferenceBuild) {
  // U+1C89 (Unicode 16) is a letter for the reference tokenizers build even though PCRE2 10.42 predates it.
  EXPECT_EQ(matches(R"(\p{L}+)", "\xE1\xB2\x89x"), V({"\xE1\xB2\x89x"}));
  // U+9FA5 is Han in DeepSeek's B range, U+9FA6 is not.
  EXPECT_EQ(matches("[\xE4\xB8\x80-\xE9\xBE\xA5]+", "\xE9\xBE\xA5\xE9\xBE\xA6"), V({"\xE9\xBE\xA5"}));
}

TEST(Bpe, MergeOrderAndIgnoreMerges) {
  // vocab a b c aa ab bc abc; merges (a,a) < (b,c) < (a,b) < (a,bc).
  const char* json = R"({
    "model": {"type": "BPE", "ignore_merges": false,
      "vocab": {"a": 0, "b": 1, "c": 2, "aa": 3, "ab": 4, "bc": 5, "abc": 6, "aaa": 7},
      "merges": ["a a", "b c", "a b", "a bc"]},
    "pre_tokenizer": {"type": "WhitespaceSplit"}})";
  const Tokenizer t = Tokenizer::from_json(json, "mini.json");
  EXPECT_EQ(t.encode("aaa", false), (std::vector<TokenId>{3, 0}));  // leftmost pair first: aa a
  EXPECT_EQ(t.encode("abc", false), (std::vector<TokenId>{6}));     // (b,c) before (a,b), then (a,bc)
  EXPECT_EQ(t.encode("aaaa", false), (std::vector<TokenId>{3, 3}));
  EXPECT_EQ(t.encode("ab c", false), (std::vector<TokenId>{4, 2}));
  EXPECT_EQ(t.decode(std::vector<TokenId>{4, 2}), "ab c");  // no decoder: joined with spaces
  // ignore_merges: a whole-word vocab hit wins over the merges.
  std::string j2 = json;
  j2.replace(j2.find("\"ignore_merges\": false"), 22, "\"ignore_merges\": true");
  const Tokenizer t2 = Tokenizer::from_json(j2, "mini2.json");
  EXPECT_EQ(t2.encode("aaa", false), (std::vector<TokenId>{7}));
  // Unknown characters without unk_token or byte_fallback are dropped, as HF does.
  EXPECT_EQ(t.encode("axb", false), (std::vector<TokenId>{4}));
}

}  // namespace
}  // namespace latent
