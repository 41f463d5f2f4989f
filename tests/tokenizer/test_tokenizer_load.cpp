// Loading: strict validation (malformed or unsupported tokenizer.json -> latent::Error naming the file and the
// type / field), tokenizer_config.json, the queries of the API.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace latent {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string data_dir(const std::string& name) {
  return std::string(LATENT_SOURCE_DIR) + "/tests/data/tokenizer/" + name;
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json glm_json() {
  static const nlohmann::json j = nlohmann::json::parse(read(data_dir("glm5") + "/tokenizer.json"));
  return j;
}

// The Error message of loading `j` (fails the test when loading succeeds).
std::string load_error(const nlohmann::json& j) {
  try {
    Tokenizer::from_parsed(j, "bad/tokenizer.json");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading did not fail";
  return {};
}

std::string mutated_error(const std::function<void(nlohmann::json&)>& f) {
  nlohmann::json j = glm_json();
  f(j);
  return load_error(j);
}

TEST(TokenizerLoad, UnknownComponentTypesNameTypeAndFile) {
  EXPECT_THAT(mutated_error([](auto& j) {
                j["normalizer"] = {{"type", "Frobnicate"}};
              }),
              AllOf(HasSubstr("bad/tokenizer.json"), HasSubstr("normalizer"), HasSubstr("'Frobnicate'")));
  EXPECT_THAT(mutated_error([](auto& j) {
                j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Quux"}};
              }),
              AllOf(HasSubstr("bad/tokenizer.json"), HasSubstr("pre_tokenizer"), HasSubstr("'Quux'")));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["type"] = "WordPiece"; }),
              AllOf(HasSubstr("bad/tokenizer.json"), HasSubstr("model type 'WordPiece'")));
  EXPECT_THAT(mutated_error([](auto& j) {
                j["decoder"] = {{"type", "Zap"}};
              }),
              AllOf(HasSubstr("bad/tokenizer.json"), HasSubstr("decoder"), HasSubstr("'Zap'")));
  EXPECT_THAT(mutated_error([](auto& j) {
                j["post_processor"] = {{"type", "Blah"}};
              }),
              AllOf(HasSubstr("bad/tokenizer.json"), HasSubstr("post_processor"), HasSubstr("'Blah'")));
  EXPECT_THAT(mutated_error([](auto& j) {
                j["pre_tokenizer"] = {{"type", "Metaspace"}};
              }),
              HasSubstr("'Metaspace' is not supported"));
  EXPECT_THAT(mutated_error([](auto& j) { j["normalizer"] = {{"noType", 1}}; }), HasSubstr("no \"type\""));
}

TEST(TokenizerLoad, MalformedMerges) {
  EXPECT_THAT(mutated_error([](auto& j) {
                j["model"]["merges"][3] = {"Ġ", "not-a-token-xyz"};
              }),
              AllOf(HasSubstr("merges[3]"), HasSubstr("not-a-token-xyz"), HasSubstr("not in the vocab")));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["merges"][5] = "a b c"; }),
              AllOf(HasSubstr("merges[5]"), HasSubstr("one space")));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["merges"][5] = "ab"; }), HasSubstr("merges[5]"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["merges"][7] = 42; }), HasSubstr("merges[7]"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["merges"] = "nope"; }), HasSubstr("merges is not an array"));
  // Both tokens exist but their concatenation does not.
  EXPECT_THAT(mutated_error([](auto& j) {
                j["model"]["merges"][0] = {"Q", "Z"};
              }),
              AllOf(HasSubstr("merged token"), HasSubstr("QZ")));
}

TEST(TokenizerLoad, MalformedVocabAndModel) {
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["vocab"]["Ġthe"] = -4; }), HasSubstr("model.vocab"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["vocab"]["Ġthe"] = "x"; }), HasSubstr("model.vocab"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["vocab"] = nlohmann::json::array(); }),
              HasSubstr("vocab is not an object"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"].erase("vocab"); }), HasSubstr("\"vocab\""));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["dropout"] = 0.1; }), HasSubstr("dropout"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["unk_token"] = "<nope>"; }), HasSubstr("unk_token"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["ignore_merges"] = "yes"; }), HasSubstr("ignore_merges"));
  EXPECT_THAT(mutated_error([](auto& j) { j["model"]["vocab"]["huge"] = 2000000000; }), HasSubstr("sparse"));
}

TEST(TokenizerLoad, MalformedAddedTokens) {
  EXPECT_THAT(mutated_error([](auto& j) { j["added_tokens"][1]["id"] = j["added_tokens"][0]["id"]; }),
              AllOf(HasSubstr("added_tokens[1]"), HasSubstr("two added tokens")));
  EXPECT_THAT(mutated_error([](auto& j) { j["added_tokens"][0]["content"] = "Ġthe"; }),
              AllOf(HasSubstr("added_tokens[0]"), HasSubstr("vocab gives it id")));
  EXPECT_THAT(mutated_error([](auto& j) { j["added_tokens"][0]["special"] = "true"; }), HasSubstr("special"));
  EXPECT_THAT(mutated_error([](auto& j) { j["added_tokens"][0].erase("id"); }), HasSubstr("added_tokens[0]"));
  EXPECT_THAT(mutated_error([](auto& j) { j["added_tokens"][0]["id"] = 1999999999; }), HasSubstr("past the vocab"));
  EXPECT_THAT(mutated_error([](auto& j) { j["added_tokens"] = 3; }), HasSubstr("added_tokens"));
}

TEST(TokenizerLoad, BadRegexesAndProcessors) {
  EXPECT_THAT(mutated_error([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(abc"; }),
              AllOf(HasSubstr("bad/tokenizer.json"), HasSubstr("(abc")));
  EXPECT_THAT(
      mutated_error([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[[:alpha:]]"; }),
      HasSubstr("POSIX bracket"));
  EXPECT_THAT(mutated_error([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; }),
              HasSubstr("'Sideways'"));
  EXPECT_THAT(mutated_error([](auto& j) {
                j["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Digits"}, {"individual_digits", true}});
              }),
              HasSubstr("after ByteLevel"));
  EXPECT_THAT(mutated_error([](auto& j) {
                j["post_processor"] = {{"type", "TemplateProcessing"},
                                       {"single", {{{"SpecialToken", {{"id", "<x>"}, {"type_id", 0}}}}}},
                                       {"special_tokens", nlohmann::json::object()}};
              }),
              HasSubstr("<x>"));
}

TEST(TokenizerLoad, NotJsonAndMissingFiles) {
  EXPECT_THROW(Tokenizer::from_json("{\"model\": ", "x.json"), Error);
  try {
    Tokenizer::from_json("[1, 2", "broken.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("broken.json"), HasSubstr("invalid JSON")));
  }
  EXPECT_THROW(Tokenizer::from_json("[]", "x.json"), Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/dir"), Error);
  try {
    const auto cfg = nlohmann::json::parse("{\"bos_token\": 5}");
    Tokenizer::from_parsed(glm_json(), "t.json", &cfg);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bos_token"));
  }
  EXPECT_THROW(Tokenizer::from_json(glm_json().dump(), "t.json", "{\"add_bos_token\": \"yes\"}"), Error);
  EXPECT_THROW(Tokenizer::from_json(glm_json().dump(), "t.json", "{\"add_bos_token\": "), Error);
}

TEST(TokenizerLoad, ConfigAndQueries) {
  const Tokenizer glm = Tokenizer::from_file(data_dir("glm5"));
  EXPECT_EQ(glm.config().eos_token, "<|endoftext|>");
  EXPECT_EQ(glm.config().bos_token, "");
  EXPECT_FALSE(glm.bos_id().has_value());
  EXPECT_EQ(glm.eos_id(), glm.token_to_id("<|endoftext|>"));
  EXPECT_TRUE(glm.prefix_ids().empty());
  EXPECT_TRUE(glm.byte_level_decoder());
  const TokenId user = glm.token_to_id("<|user|>").value();
  EXPECT_TRUE(glm.is_special(user));
  EXPECT_TRUE(glm.is_added(user));
  EXPECT_EQ(glm.id_to_token(user), "<|user|>");
  EXPECT_FALSE(glm.is_special(glm.token_to_id("/nothink").value()));
  EXPECT_EQ(glm.added_tokens().size(), 32u);
  EXPECT_EQ(glm.vocab_size(), glm.id_limit());
  EXPECT_FALSE(glm.id_to_token(static_cast<TokenId>(glm.id_limit())).has_value());
  EXPECT_FALSE(glm.id_to_token(-1).has_value());
  // Typed /nothink and special strings become their ids (HF parity); split_special_tokens keeps only
  // non-special ones.
  EXPECT_EQ(glm.encode("/nothink", false), std::vector<TokenId>{glm.token_to_id("/nothink").value()});
  EncodeOptions split;
  split.add_special_tokens = false;
  split.split_special_tokens = true;
  EXPECT_NE(glm.encode("<|user|>", split), std::vector<TokenId>{user});
  EXPECT_EQ(glm.encode("<think>", split), std::vector<TokenId>{glm.token_to_id("<think>").value()});

  const Tokenizer ds = Tokenizer::from_file(data_dir("deepseek_v3") + "/tokenizer.json");
  EXPECT_EQ(ds.config().tokenizer_class, "LlamaTokenizerFast");
  EXPECT_EQ(ds.bos_id(), 0);
  EXPECT_EQ(ds.eos_id(), 1);
  EXPECT_EQ(ds.prefix_ids(), std::vector<TokenId>{0});
  EXPECT_EQ(ds.encode("hi", true).front(), 0);
  EXPECT_EQ(ds.encode("", true), std::vector<TokenId>{0});
  EXPECT_TRUE(ds.encode("", false).empty());
  EXPECT_EQ(ds.config().add_bos_token, true);
  // The DeepSeek BOS string inside the text is the BOS id, once from the text and once from the post-processor.
  EXPECT_EQ(ds.encode("<\xEF\xBD\x9C"
                      "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                      true),
            (std::vector<TokenId>{0, 0}));

  // transformers' Llama post-processor rule: add_bos_token false drops the BOS, add_eos_token adds the EOS.
  const auto dsj = nlohmann::json::parse(read(data_dir("deepseek_v3") + "/tokenizer.json"));
  auto cfg = nlohmann::json::parse(read(data_dir("deepseek_v3") + "/tokenizer_config.json"));
  cfg["add_bos_token"] = false;
  cfg["add_eos_token"] = true;
  const Tokenizer ds2 = Tokenizer::from_parsed(dsj, "ds", &cfg);
  EXPECT_TRUE(ds2.prefix_ids().empty());
  EXPECT_EQ(ds2.suffix_ids(), std::vector<TokenId>{1});
  EXPECT_EQ(ds2.encode("hi", true).back(), 1);
}

TEST(TokenizerLoad, ChatTemplateSources) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("latent_tok_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(data_dir("glm5") + "/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  {
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  }
  EXPECT_EQ(Tokenizer::from_file(dir.string()).config().chat_template, "D");
  { std::ofstream(dir / "chat_template.jinja") << "J{{ x }}"; }
  EXPECT_EQ(Tokenizer::from_file(dir.string()).config().chat_template, "J{{ x }}");
  fs::remove_all(dir);
}

TEST(TokenizerLoad, InvalidUtf8InputIsRepairedNotFatal) {
  const Tokenizer glm = Tokenizer::from_file(data_dir("glm5"));
  const std::string bad = "ab\xE4\xB8 c\xFF";
  EXPECT_EQ(glm.encode(bad, false), glm.encode("ab\xEF\xBF\xBD c\xEF\xBF\xBD", false));
  EXPECT_EQ(glm.decode(glm.encode(bad, false)), "ab\xEF\xBF\xBD c\xEF\xBF\xBD");
}

TEST(TokenizerLoad, ThreadSafeEncode) {
  const Tokenizer glm = Tokenizer::from_file(data_dir("glm5"));
  const std::string text = "The quick brown fox jumps over the lazy dog. \xE4\xBD\xA0\xE5\xA5\xBD 12345 <|user|> x";
  const auto want = glm.encode(text, false);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i)
        if (glm.encode(text + std::to_string(i % 7), false).size() < want.size()) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace latent
