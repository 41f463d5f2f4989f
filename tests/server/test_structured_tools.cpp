// The tool-call grammars (structured/constraint.h) against the server's tool parsers (server/tool_parser.h): every
// complete text a random walk through the grammar produces parses into calls of the requested tools whose
// arguments have the schema's keys and types.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>

#include "server/tool_parser.h"
#include "structured/constraint.h"

namespace latent::server {
namespace {

using ojson = nlohmann::ordered_json;
using namespace latent::structured;

const ojson kTools = ojson::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
    "city":{"type":"string","maxLength":12},"unit":{"type":"string","enum":["celsius","fahrenheit"]},
    "days":{"type":"integer"},"detail":{"type":"boolean"}},"required":["city","unit"]}}},
  {"type":"function","function":{"name":"calc","parameters":{"type":"object","properties":{
    "expr":{"type":"string","maxLength":8},"precision":{"type":["integer","null"]},
    "vars":{"type":"array","items":{"type":"number"},"maxItems":2}},"required":["expr"]}}}])");

bool type_ok(const ojson& schema, const ojson& v) {
  if (schema.contains("enum")) {
    for (const auto& e : schema["enum"])
      if (e == v) return true;
    return false;
  }
  auto one = [&](const std::string& t) {
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer();
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "array") {
      if (!v.is_array()) return false;
      for (const auto& e : v)
        if (!type_ok(schema["items"], e)) return false;
      return v.size() <= schema.value("maxItems", 1000u);
    }
    return false;
  };
  if (schema["type"].is_array()) {
    for (const auto& t : schema["type"])
      if (one(t)) return true;
    return false;
  }
  return one(schema["type"]);
}

void check_calls(const std::vector<ToolCall>& calls, const std::string& text) {
  ASSERT_FALSE(calls.empty()) << text;
  for (const auto& c : calls) {
    const ojson* params = nullptr;
    for (const auto& t : kTools)
      if (t["function"]["name"] == c.name) params = &t["function"]["parameters"];
    ASSERT_NE(params, nullptr) << c.name;
    const ojson args = ojson::parse(c.arguments);
    for (const auto& r : (*params)["required"]) EXPECT_TRUE(args.contains(r.get<std::string>())) << text;
    for (auto it = args.begin(); it != args.end(); ++it) {
      ASSERT_TRUE((*params)["properties"].contains(it.key())) << it.key();
      EXPECT_TRUE(type_ok((*params)["properties"][it.key()], *it)) << it.key() << " = " << it->dump() << " in " << text;
    }
  }
}

// Random complete outputs of the grammar, over a vocabulary of single bytes plus the syntax's markers.
std::vector<std::string> samples(const std::shared_ptr<const Grammar>& g, uint32_t seed, int n) {
  std::vector<std::string> v;
  for (int b = 0x20; b < 0x7F; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  v.push_back("\n");
  for (const char* m : {"<tool_call>",
                        "</tool_call>",
                        "<arg_key>",
                        "</arg_key>",
                        "<arg_value>",
                        "</arg_value>",
                        "get_weather",
                        "calc",
                        "city",
                        "unit",
                        "days",
                        "detail",
                        "expr",
                        "precision",
                        "vars",
                        "celsius",
                        "<｜tool▁calls▁begin｜>",
                        "<｜tool▁call▁begin｜>",
                        "<｜tool▁sep｜>",
                        "<｜tool▁call▁end｜>",
                        "<｜tool▁calls▁end｜>",
                        "function",
                        "\n```json\n",
                        "\n```",
                        "é",
                        "日本",
                        "｜",
                        "▁"})
    v.push_back(m);
  v.push_back("");
  const int32_t stop = static_cast<int32_t>(v.size() - 1);
  auto cg = std::make_shared<CompiledGrammar>();
  cg->grammar = g;
  cg->vocab = std::make_shared<TokenVocab>(v, std::vector<int32_t>{stop});
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  std::vector<uint64_t> mask(cg->vocab->mask_words());
  while (static_cast<int>(out.size()) < n) {
    Matcher m(cg);
    std::string text;
    for (int step = 0; step < 600 && !m.is_complete(); ++step) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(v.size()); ++id)
        if ((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u) allowed.push_back(id);
      if (allowed.empty()) {
        ADD_FAILURE() << "nothing allowed after " << text;
        return out;
      }
      int32_t t = allowed[rng() % allowed.size()];
      if (t != stop && m.can_end() && rng() % 3 == 0) t = stop;
      if (!m.accept_token(t)) {
        ADD_FAILURE() << "the matcher refused an allowed token after " << text;
        return out;
      }
      if (t != stop) text += v[static_cast<size_t>(t)];
    }
    if (m.is_complete() || m.can_end()) out.push_back(text);
  }
  return out;
}

TEST(StructuredTools, GlmGrammarOutputParsesIntoValidCalls) {
  for (const std::string only : {"", "calc"}) {
    auto g = tool_call_grammar(ToolSyntax::Glm, kTools, only, only.empty());
    for (const auto& text : samples(g, 7, 40)) {
      auto p = make_tool_parser(ToolFormat::Glm47, kTools);
      ToolParser::Out out;
      p->feed(text, out);
      p->finish(out);
      EXPECT_TRUE(out.content.find_first_not_of(" \n") == std::string::npos) << "[" << out.content << "] " << text;
      check_calls(out.calls, text);
      if (!only.empty()) {
        ASSERT_EQ(out.calls.size(), 1u);
        EXPECT_EQ(out.calls[0].name, only);
      }
    }
  }
}

TEST(StructuredTools, DeepSeekGrammarOutputParsesIntoValidCalls) {
  for (auto syntax : {ToolSyntax::DeepSeekV3, ToolSyntax::DeepSeekV31}) {
    auto g = tool_call_grammar(syntax, kTools, "", true);
    for (const auto& text : samples(g, 9, 30)) {
      auto p = make_tool_parser(ToolFormat::DeepSeek, kTools);
      ToolParser::Out out;
      p->feed(text, out);
      p->finish(out);
      EXPECT_TRUE(out.content.empty()) << out.content;
      check_calls(out.calls, text);
    }
  }
}

}  // namespace
}  // namespace latent::server
