// Reasoning split, tool-call parsers, streaming detokenization and the per-choice output pipeline: streaming and
// non-streaming agree, stop strings never leak, tool calls parse into OpenAI shape.
#include <gtest/gtest.h>

#include <random>

#include "fake_model.h"
#include "server/choice_output.h"
#include "server/detok_stream.h"
#include "server/openai_format.h"
#include "server/reasoning.h"
#include "server/tool_parser.h"

namespace latent::server {
namespace {

using latent::testing::FakeCodec;
using ojson = nlohmann::ordered_json;

// Feeds `text` to a fresh parser cut at the given points; returns content and calls.
std::pair<std::string, std::vector<ToolCall>> parse_split(ToolFormat f, const std::string& text,
                                                          const std::vector<size_t>& cuts,
                                                          const ojson& tools = nullptr) {
  auto p = make_tool_parser(f, tools);
  ToolParser::Out out;
  size_t prev = 0;
  for (size_t c : cuts) {
    if (c <= prev || c > text.size()) continue;
    p->feed(std::string_view(text).substr(prev, c - prev), out);
    prev = c;
  }
  p->feed(std::string_view(text).substr(prev), out);
  p->finish(out);
  return {out.content, out.calls};
}

void expect_all_splits_equal(ToolFormat f, const std::string& text, const ojson& tools = nullptr) {
  const auto whole = parse_split(f, text, {}, tools);
  for (size_t i = 1; i < text.size(); ++i) {
    const auto s = parse_split(f, text, {i}, tools);
    EXPECT_EQ(s.first, whole.first) << "cut at " << i;
    ASSERT_EQ(s.second.size(), whole.second.size()) << "cut at " << i;
    for (size_t k = 0; k < s.second.size(); ++k) EXPECT_EQ(s.second[k].arguments, whole.second[k].arguments);
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const auto bytes = parse_split(f, text, every, tools);
  EXPECT_EQ(bytes.first, whole.first);
  EXPECT_EQ(bytes.second.size(), whole.second.size());
}

TEST(ToolParser, GlmCallsAndTyping) {
  const ojson tools =
      ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"},"zip":{"type":"string"}}}}}])");
  const std::string text =
      "Let me check.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>zip</arg_key><arg_value>75001</arg_value>"
      "<arg_key>extra</arg_key><arg_value>{\"a\": [1, 2.5, true]}</arg_value></tool_call>"
      "<tool_call>noargs</tool_call><tool_call> spaced \n</tool_call>";
  auto [content, calls] = parse_split(ToolFormat::Glm47, text, {}, tools);
  EXPECT_EQ(content, "Let me check.");
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments, R"({"city": "Paris", "days": 3, "zip": "75001", "extra": {"a": [1, 2.5, true]}})");
  EXPECT_EQ(calls[1].name, "noargs");
  EXPECT_EQ(calls[1].arguments, "{}");
  EXPECT_EQ(calls[2].name, "spaced");
  EXPECT_TRUE(ojson::parse(calls[0].arguments).is_object());
  expect_all_splits_equal(ToolFormat::Glm47, text, tools);
}

TEST(ToolParser, GlmUnknownKeyAndNonJsonStaysString) {
  auto [content, calls] = parse_split(ToolFormat::Glm47,
                                      "<tool_call>f<arg_key>q</arg_key><arg_value>hello world</arg_value>"
                                      "<arg_key>n</arg_key><arg_value>12</arg_value></tool_call>",
                                      {});
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, R"({"q": "hello world", "n": 12})");
  EXPECT_EQ(content, "");
}

TEST(ToolParser, GlmUnterminatedCallIsRawText) {
  const std::string text = "ok <tool_call>f<arg_key>a</arg_key><arg_val";
  auto [content, calls] = parse_split(ToolFormat::Glm47, text, {5, 9, 20});
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(content, text);
  auto held = parse_split(ToolFormat::Glm47, "text <tool_ca", {});
  EXPECT_EQ(held.first, "text <tool_ca");  // a partial marker at the end is flushed as text
}

TEST(ToolParser, GlmMalformedBlockIsText) {
  auto [content, calls] = parse_split(ToolFormat::Glm47, "<tool_call>f<arg_value>x</arg_value></tool_call>", {});
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(content, "<tool_call>f<arg_value>x</arg_value></tool_call>");
}

TEST(ToolParser, DeepSeekV3AndV31) {
  const std::string v3 =
      "Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\":\"Paris\"}"
      "\n```"
      "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>noop\n```json\n{}\n```<｜tool▁call▁end｜><"
      "｜tool▁calls▁end｜>";
  auto [c1, calls1] = parse_split(ToolFormat::DeepSeek, v3, {});
  EXPECT_EQ(c1, "Sure");
  ASSERT_EQ(calls1.size(), 2u);
  EXPECT_EQ(calls1[0].name, "get_weather");
  EXPECT_EQ(calls1[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(calls1[1].arguments, "{}");
  expect_all_splits_equal(ToolFormat::DeepSeek, v3);
  const std::string v31 =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"x\", \"n\": "
      "2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  auto [c2, calls2] = parse_split(ToolFormat::DeepSeek, v31, {});
  EXPECT_EQ(c2, "");
  ASSERT_EQ(calls2.size(), 1u);
  EXPECT_EQ(calls2[0].name, "search");
  EXPECT_EQ(calls2[0].arguments, R"({"q": "x", "n": 2})");
}

TEST(ToolParser, PyJsonDumps) {
  EXPECT_EQ(py_json_dumps(ojson::parse(R"({"a":[1,{"b":null}],"é":"\n"})")),
            "{\"a\": [1, {\"b\": null}], \"é\": \"\\n\"}");
}

TEST(Reasoning, InitialChannelAndTransitions) {
  ReasoningTokens t;
  t.think_start = 10;
  t.think_end = 11;
  t.tool_start = {12};
  t.assistant = {5};
  const std::vector<int32_t> on = {1, 5, 10}, off = {1, 5, 11}, none = {1, 5}, hist = {10, 3, 5};
  EXPECT_EQ(initial_channel(on, t), Channel::Reasoning);
  EXPECT_EQ(initial_channel(off, t), Channel::Content);
  EXPECT_EQ(initial_channel(none, t), Channel::Content);
  EXPECT_EQ(initial_channel(hist, t), Channel::Content);  // <think> before the last assistant header does not count
  ReasoningSplitter s(&t, true, Channel::Reasoning);
  EXPECT_EQ(s.route(3).channel, Channel::Reasoning);
  auto r = s.route(11);
  EXPECT_TRUE(r.drop);
  EXPECT_EQ(s.route(3).channel, Channel::Content);
  r = s.route(10);  // <think> in content -> reasoning
  EXPECT_TRUE(r.drop);
  EXPECT_EQ(s.route(3).channel, Channel::Reasoning);
  EXPECT_EQ(s.route(12).channel, Channel::Content);  // tool call start ends reasoning, kept
  ReasoningSplitter off_s(&t, false, Channel::Reasoning);
  EXPECT_EQ(off_s.route(3).channel, Channel::Content);
  EXPECT_FALSE(off_s.route(11).drop);
}

TEST(DetokStream, Utf8Assembly) {
  Utf8Assembler a;
  EXPECT_EQ(a.push("\xE4"), "");
  EXPECT_EQ(a.push("\xB8"), "");
  EXPECT_EQ(a.push("\xAD!"), "中!");
  EXPECT_EQ(a.push("\xF0\x9F"), "");
  EXPECT_EQ(a.push("\x98\x80"), "😀");
  EXPECT_EQ(a.push("\xFF"), "\xEF\xBF\xBD");                                  // never valid: replaced at once
  EXPECT_EQ(a.push("\xE4\xB8<"), "\xEF\xBF\xBD<");                            // truncated sequence then ASCII
  EXPECT_EQ(a.push("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: 3 maximal subparts
  EXPECT_EQ(a.push("\xE4\xB8"), "");
  EXPECT_EQ(a.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(lossy_utf8("a\xC3\x28"), "a\xEF\xBF\xBD(");
}

// --- the whole pipeline --------------------------------------------------------------------------------------------

struct Run {
  std::string reasoning, content, finish;
  std::vector<std::string> content_chunks;
  std::vector<ToolCallDelta> tool_deltas;
  int64_t completion = 0, reasoning_tokens = 0;
};

Run run_pipeline(const std::vector<int32_t>& ids, OutputConfig cfg, bool eos_at_end = true,
                 FinishReason why = FinishReason::Stop) {
  static FakeCodec codec;
  static ReasoningTokens rt = [] {
    ReasoningTokens t;
    t.think_start = FakeCodec::kThink;
    t.think_end = FakeCodec::kThinkEnd;
    t.tool_start = {FakeCodec::kToolCall};
    t.assistant = {FakeCodec::kAssistant};
    return t;
  }();
  cfg.codec = &codec;
  cfg.reasoning_tokens = &rt;
  ChoiceOutput o(cfg);
  Run r;
  bool stopped = false;
  for (int32_t id : ids) {
    ChoiceDelta d;
    SampleResult s;
    s.token = id;
    stopped = o.push(s, false, d);
    r.reasoning += d.reasoning;
    r.content += d.content;
    if (!d.content.empty()) r.content_chunks.push_back(d.content);
    for (auto& t : d.tool_calls) r.tool_deltas.push_back(t);
    if (stopped) break;
  }
  if (!stopped && eos_at_end) {
    ChoiceDelta d;
    SampleResult s;
    s.token = FakeCodec::kEos;
    o.push(s, true, d);
  }
  ChoiceDelta d;
  r.finish = o.finish(stopped ? FinishReason::Stop : why, d);
  r.reasoning += d.reasoning;
  r.content += d.content;
  if (!d.content.empty()) r.content_chunks.push_back(d.content);
  for (auto& t : d.tool_calls) r.tool_deltas.push_back(t);
  EXPECT_EQ(r.reasoning, o.reasoning());
  EXPECT_EQ(r.content, o.content());
  r.completion = o.completion_tokens();
  r.reasoning_tokens = o.reasoning_tokens();
  return r;
}

TEST(ChoiceOutput, ReasoningThenContent) {
  OutputConfig c;
  c.reasoning_enabled = true;
  c.initial = Channel::Reasoning;
  auto r = run_pipeline(latent::testing::script("I think.</think>Paris."), c);
  EXPECT_EQ(r.reasoning, "I think.");
  EXPECT_EQ(r.content, "Paris.");
  EXPECT_EQ(r.finish, "stop");
  EXPECT_EQ(r.reasoning_tokens, 8);        // "I think." bytes, not </think>
  EXPECT_EQ(r.completion, 8 + 1 + 6 + 1);  // + </think> + "Paris." + EOS
}

TEST(ChoiceOutput, LengthInsideReasoningLeavesContentEmpty) {
  OutputConfig c;
  c.reasoning_enabled = true;
  c.initial = Channel::Reasoning;
  auto r = run_pipeline(latent::testing::script("still thinking"), c, false, FinishReason::Length);
  EXPECT_EQ(r.reasoning, "still thinking");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.finish, "length");
}

TEST(ChoiceOutput, StopStringNeverSplitMidStream) {
  OutputConfig c;
  c.stop = {"END", "STOP!"};
  auto r = run_pipeline(latent::testing::script("one E two EN three ENDED"), c);
  EXPECT_EQ(r.content, "one E two EN three ");
  EXPECT_EQ(r.finish, "stop");
  for (const auto& ch : r.content_chunks) EXPECT_EQ(ch.find("END"), std::string::npos);
  // No chunk ends with a prefix of END that the next chunk completes.
  std::string acc;
  for (const auto& ch : r.content_chunks) acc += ch;
  EXPECT_EQ(acc, r.content);
}

TEST(ChoiceOutput, StopStringOnlyInContentChannel) {
  OutputConfig c;
  c.reasoning_enabled = true;
  c.initial = Channel::Reasoning;
  c.stop = {"\n\n"};
  auto r = run_pipeline(latent::testing::script("a\n\nb</think>x\n\ny"), c);
  EXPECT_EQ(r.reasoning, "a\n\nb");
  EXPECT_EQ(r.content, "x");
}

// /v1/completions echo: the prompt text comes first, its first token with a null logprob, then the prompt's
// scored tokens and the generated ones; only generated tokens count as completion tokens.
TEST(ChoiceOutput, EchoPromptThenGenerated) {
  static FakeCodec codec;
  OutputConfig c;
  c.codec = &codec;
  c.logprobs = true;
  c.echo = true;
  c.echo_text = "Hi";
  c.echo_first_token = 'H';
  ChoiceOutput o(c);
  ChoiceDelta d0;
  SampleResult i;
  i.token = 'i';
  i.logprob = -0.5f;
  i.top = {{'a', -0.25f}};
  o.echo({i}, d0);
  EXPECT_EQ(d0.content, "Hi");
  ASSERT_EQ(d0.logprobs.size(), 2u);
  EXPECT_TRUE(d0.logprobs[0].null_logprob);
  EXPECT_FALSE(d0.logprobs[1].null_logprob);
  ChoiceDelta d1;
  SampleResult g;
  g.token = '!';
  g.logprob = -1.0f;
  o.push(g, false, d1);
  ChoiceDelta d2;
  EXPECT_EQ(o.finish(FinishReason::Length, d2), "length");
  EXPECT_EQ(o.content(), "Hi!");
  EXPECT_EQ(o.completion_tokens(), 1);
  const ojson j = completion_logprobs_json(o.all_logprobs(), codec);
  EXPECT_EQ(j["tokens"], ojson::parse(R"(["H","i","!"])"));
  EXPECT_EQ(j["token_logprobs"], ojson::parse(R"([null,-0.5,-1.0])"));
  EXPECT_TRUE(j["top_logprobs"][0].is_null());
  EXPECT_EQ(j["top_logprobs"][1], ojson::parse(R"({"a":-0.25})"));
  EXPECT_EQ(j["text_offset"], ojson::parse("[0,1,2]"));
  // Without echo the same call adds nothing.
  OutputConfig plain = c;
  plain.echo = false;
  ChoiceOutput p(plain);
  ChoiceDelta d3;
  p.echo({i}, d3);
  EXPECT_FALSE(d3.has_output());
  EXPECT_TRUE(d3.logprobs.empty());
}

TEST(ChoiceOutput, ToolCallsGlm) {
  OutputConfig c;
  c.reasoning_enabled = true;
  c.initial = Channel::Reasoning;
  c.tool_format = ToolFormat::Glm47;
  auto r = run_pipeline(
      latent::testing::script(
          "plan</think>\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"),
      c);
  EXPECT_EQ(r.reasoning, "plan");
  EXPECT_EQ(r.content, "");  // whitespace-only content with a tool call is null
  EXPECT_EQ(r.finish, "tool_calls");
  ASSERT_EQ(r.tool_deltas.size(), 2u);
  EXPECT_TRUE(r.tool_deltas[0].first);
  EXPECT_EQ(r.tool_deltas[0].name, "get_weather");
  EXPECT_EQ(r.tool_deltas[0].id.substr(0, 5), "call_");
  EXPECT_EQ(r.tool_deltas[0].id.size(), 29u);
  EXPECT_EQ(r.tool_deltas[1].arguments, R"({"city": "Paris"})");
}

TEST(ChoiceOutput, ToolCallInsideReasoningSwitchesToContent) {
  OutputConfig c;
  c.reasoning_enabled = true;
  c.initial = Channel::Reasoning;
  c.tool_format = ToolFormat::Glm47;
  auto r = run_pipeline(latent::testing::script("hmm<tool_call>f</tool_call>"), c);
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.finish, "tool_calls");
  ASSERT_EQ(r.tool_deltas.size(), 2u);
  EXPECT_EQ(r.tool_deltas[1].arguments, "{}");
}

TEST(ChoiceOutput, ParallelToolCallsFalseKeepsFirst) {
  OutputConfig c;
  c.tool_format = ToolFormat::Glm47;
  c.parallel_tool_calls = false;
  auto r = run_pipeline(latent::testing::script("<tool_call>a</tool_call><tool_call>b</tool_call>"), c);
  ASSERT_EQ(r.tool_deltas.size(), 2u);
  EXPECT_EQ(r.tool_deltas[0].name, "a");
}

TEST(ChoiceOutput, LengthCutsUnterminatedCallToText) {
  OutputConfig c;
  c.tool_format = ToolFormat::Glm47;
  auto r = run_pipeline(latent::testing::script("x<tool_call>f<arg_key>a"), c, false, FinishReason::Length);
  EXPECT_EQ(r.content, "x<tool_call>f<arg_key>a");
  EXPECT_TRUE(r.tool_deltas.empty());
  EXPECT_EQ(r.finish, "length");
}

TEST(ChoiceOutput, SpecialTokensSkippedAndThinkMarkersNeverShown) {
  OutputConfig c;  // no reasoning parser: everything is content, but <think> markers are not special here
  c.skip_special = true;
  auto r = run_pipeline({'a', FakeCodec::kUser, 'b'}, c);
  EXPECT_EQ(r.content, "ab");
  c.skip_special = false;
  r = run_pipeline({'a', FakeCodec::kUser, 'b'}, c);
  EXPECT_EQ(r.content, "a<|user|>b");
}

TEST(ChoiceOutput, MultiByteCharactersAcrossTokens) {
  OutputConfig c;
  const std::string s = "中文😀";
  std::vector<int32_t> ids;
  for (unsigned char b : s) ids.push_back(b);
  auto r = run_pipeline(ids, c);
  EXPECT_EQ(r.content, s);
  for (const auto& ch : r.content_chunks) EXPECT_EQ(lossy_utf8(ch), ch);  // every chunk is valid UTF-8
}

TEST(ChoiceOutput, RandomStreamsMatchWholeDecode) {
  std::mt19937 g(5);
  const std::vector<std::string> pieces = {"a",           "b",
                                           " ",           "\n",
                                           "<tool_call>", "</tool_call>",
                                           "<arg_key>",   "</arg_key>",
                                           "<arg_value>", "</arg_value>",
                                           "x",           "EN",
                                           "D",           "{",
                                           "1",           "\""};
  for (int it = 0; it < 300; ++it) {
    std::string text;
    const int n = 1 + static_cast<int>(g() % 30);
    for (int i = 0; i < n; ++i) text += pieces[g() % pieces.size()];
    OutputConfig c;
    c.tool_format = ToolFormat::Glm47;
    c.stop = {"END"};
    auto ids = latent::testing::script(text);
    auto r = run_pipeline(ids, c);
    // Non-streaming view of the same run equals the concatenated stream (checked inside run_pipeline), and the
    // stop string never appears.
    EXPECT_EQ(r.content.find("END"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace latent::server
