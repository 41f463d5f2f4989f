// Hand-written tests of the Jinja interpreter and ChatTemplate: limits, error positions, loading, kwargs,
// concurrency. Conformance with jinja2 itself is in test_fixtures.cpp (generated expectations).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <thread>

#include "fixtures.h"
#include "jinja/chat_template.h"
#include "jinja/error.h"
#include "jinja/template.h"

using namespace latent::jinja;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

std::string R(const std::string& src, const std::string& ctx_json = "{}", const RenderOptions& opt = {}) {
  return Template(src, "t").render(ojson::parse(ctx_json), opt);
}

ErrorKind kind_of(const std::string& src, const std::string& ctx_json = "{}", const RenderOptions& opt = {}) {
  try {
    R(src, ctx_json, opt);
  } catch (const TemplateError& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error for " << src.substr(0, 80);
  return ErrorKind::Type;
}

TemplateError error_of(const std::string& src, const std::string& ctx_json = "{}") {
  try {
    R(src, ctx_json);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << src.substr(0, 80);
  return TemplateError(ErrorKind::Type, "none");
}

struct TempDir {
  TempDir() {
    path = fs::temp_directory_path() / ("latent_jinja_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
  std::string str() const { return path.string(); }
  fs::path path;
  static inline int counter = 0;
};

}  // namespace

TEST(JinjaBasic, Smoke) {
  EXPECT_EQ(R("Hello {{ name }}!", R"({"name": "world"})"), "Hello world!");
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"), "1,2,3");
}

TEST(JinjaBasic, IntVersusFloatFromJson) {
  EXPECT_EQ(R("{{ a }} {{ b }} {{ a is integer }} {{ b is float }} {{ [a, b]|tojson }}", R"({"a": 1, "b": 1.0})"),
            "1 1.0 True True [1, 1.0]");
  EXPECT_EQ(R("{{ d|tojson }}", R"({"d": {"z": 1, "a": 2}})"), R"({"z": 1, "a": 2})");  // key order kept
  EXPECT_EQ(R("{{ n }} {{ n|tojson }}", R"({"n": 18446744073709551615})"),
            "1.8446744073709552e+19 1.8446744073709552e+19");
}

TEST(JinjaBasic, ErrorsCarryLineAndColumn) {
  TemplateError e = error_of("line1\n  {{ x }}\n  {{ x.y.z }}");
  EXPECT_EQ(e.kind(), ErrorKind::Undefined);
  EXPECT_EQ(e.line(), 3);
  EXPECT_GT(e.col(), 3);
  EXPECT_NE(std::string(e.what()).find("t:3:"), std::string::npos) << e.what();

  e = error_of("{% if true %}\n{{ 'a' + 1 }}{% endif %}");
  EXPECT_EQ(e.kind(), ErrorKind::Type);
  EXPECT_EQ(e.line(), 2);

  e = error_of("ok\n\n{% for x in y %}\n{% endif %}");
  EXPECT_EQ(e.kind(), ErrorKind::Syntax);
  EXPECT_EQ(e.line(), 4);

  e = error_of("é{{ 'abc\n}}");  // columns count code points
  EXPECT_EQ(e.kind(), ErrorKind::Syntax);
  EXPECT_EQ(e.line(), 1);
  EXPECT_EQ(e.col(), 5);

  e = error_of("{{ raise_exception('stop here') }}");
  EXPECT_EQ(e.kind(), ErrorKind::Raised);
  EXPECT_EQ(e.message(), "stop here");
  EXPECT_TRUE(dynamic_cast<const latent::Error*>(&e) != nullptr);
}

TEST(JinjaBasic, RunawayLoopsAndRecursionStop) {
  RenderOptions small;
  small.limits.max_steps = 10000;
  EXPECT_EQ(kind_of("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "{}", small),
            ErrorKind::Limit);
  EXPECT_EQ(Limits{}.max_steps, 1000000u);  // the default (hitting it takes seconds under ASan)
  EXPECT_EQ(kind_of("{% for i in range(100) %}{{ range(100000)|length }}{% endfor %}"), ErrorKind::Limit);
  EXPECT_EQ(kind_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), ErrorKind::Limit);
  EXPECT_EQ(kind_of("{% for n in t recursive %}{{ loop(t) }}{% endfor %}", R"({"t": [1]})"), ErrorKind::Limit);
  // a 200-deep recursion that stays within the limit works
  EXPECT_EQ(R("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}done{% endif %}{% endmacro %}{{ f(150) }}"),
            "done");
}

TEST(JinjaBasic, OutputAndStringSizeCapped) {
  RenderOptions small;
  small.limits.max_output = 1 << 16;
  EXPECT_EQ(kind_of("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}", "{}", small), ErrorKind::Limit);
  EXPECT_EQ(kind_of("{{ 'x' * 100000 }}", "{}", small), ErrorKind::Limit);
  EXPECT_EQ(kind_of("{{ 'x' * 1000000000000 }}"), ErrorKind::Limit);
  EXPECT_EQ(kind_of("{{ [1] * 1000000000 }}"), ErrorKind::Limit);
  EXPECT_EQ(kind_of("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
            ErrorKind::Limit);
  EXPECT_EQ(kind_of("{{ '{:>100000000000}'.format('a') }}"), ErrorKind::Limit);
}

TEST(JinjaBasic, DeepNestingIsAnErrorNotACrash) {
  EXPECT_EQ(kind_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), ErrorKind::Syntax);
  EXPECT_EQ(kind_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"), ErrorKind::Syntax);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_EQ(kind_of(ifs), ErrorKind::Syntax);
  EXPECT_EQ(kind_of("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}"),
            ErrorKind::Limit);
  std::string deep = "1";
  for (int i = 0; i < 2000; ++i) deep = "[" + deep + "]";
  EXPECT_ANY_THROW(R("{{ x }}", "{\"x\": " + deep + "}"));
}

TEST(JinjaBasic, CyclesAreReleased) {
  // A namespace that holds itself and a macro stored in a namespace form reference cycles; the interpreter
  // breaks them after the render (LeakSanitizer checks this test).
  EXPECT_EQ(R("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), "<Namespace {'me': <Namespace {...}>}>");
  EXPECT_EQ(R("{% set ns = namespace() %}{% macro m() %}{{ ns.x }}{% endmacro %}{% set ns.f = m %}{% set ns.x = 1 %}"
              "{{ ns.f() }}"),
            "1");
  EXPECT_EQ(R("{% for i in [1] %}{% set ns = namespace(l=loop) %}{{ ns.l.index }}{% endfor %}"), "1");
}

TEST(JinjaBasic, FixedClockHook) {
  RenderOptions opt = latent::jinja::testing::fixed_clock_options();
  EXPECT_EQ(R("{{ strftime_now('%Y-%m-%d %a') }}", "{}", opt), "2025-03-14 Fri");
  // default: local time
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  EXPECT_EQ(R("{{ strftime_now('%Y') }}"), std::to_string(tm.tm_year + 1900));
}

TEST(JinjaBasic, ConcurrentRenders) {
  const Template t("{% for m in messages %}{{ m.role }}:{{ m.content|upper }};{% endfor %}{{ strftime_now('%Y') }}");
  ojson ctx =
      ojson::parse(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})");
  const RenderOptions opt = latent::jinja::testing::fixed_clock_options();
  const std::string want = t.render(ctx, opt);
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int i = 0; i < 4; ++i)
    th.emplace_back([&] {
      for (int k = 0; k < 200; ++k)
        if (t.render(ctx, opt) != want) ++bad;
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- ChatTemplate ----

TEST(ChatTemplate, LoadPrefersChatTemplateJinja) {
  TempDir d;
  d.write("chat_template.jinja", "J{{ bos_token }}{{ eos_token }}{{ messages|length }}\n");
  d.write("tokenizer_config.json",
          R"({"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>", "pad_token": null,
              "chat_template": "C"})");
  auto ct = latent::ChatTemplate::load(d.str());
  EXPECT_EQ(ct.render(ojson::array(), ojson(), false), "J<s></s>0");
  EXPECT_NE(ct.origin().find("chat_template.jinja"), std::string::npos);
  EXPECT_FALSE(ct.special_tokens().contains("pad_token"));
}

TEST(ChatTemplate, LoadFromTokenizerConfig) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"chat_template": "S{{ add_generation_prompt }}{{ tools is none }}"})");
  auto ct = latent::ChatTemplate::load(d.str());
  EXPECT_EQ(ct.render(ojson::array(), ojson(), true), "STrueTrue");

  TempDir d2;
  d2.write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T{{ tools|length }}"}, {"name": "default", "template": "D"}]})");
  auto ct2 = latent::ChatTemplate::load(d2.str());
  EXPECT_EQ(ct2.render(ojson::array(), ojson(), true), "D");
  EXPECT_EQ(ct2.render(ojson::array(), ojson::parse("[{}]"), true), "T1");
}

TEST(ChatTemplate, NoTemplateIsAClearError) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  try {
    latent::ChatTemplate::load(d.str());
    FAIL() << "expected an error";
  } catch (const latent::Error& e) {
    EXPECT_EQ(
        std::string(e.what()),
        d.str() +
            ": model has no chat template (no chat_template.jinja and no chat_template in tokenizer_config.json)");
  }
  TempDir empty;
  EXPECT_THROW(latent::ChatTemplate::load(empty.str()), latent::Error);
  TempDir bad;
  bad.write("chat_template.jinja", "{% if %}");
  EXPECT_THROW(latent::ChatTemplate::load(bad.str()), TemplateError);
}

TEST(ChatTemplate, AbsentKwargStaysUndefinedNullIsDefined) {
  const auto ct = latent::ChatTemplate::from_string(
      latent::jinja::testing::read_text(latent::jinja::testing::data_path("glm5.jinja")));
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(ct.render(msgs, ojson(), true), "[gMASK]<sop><|user|>hi<|assistant|><think>");
  EXPECT_EQ(ct.render(msgs, ojson(), true, ojson::parse(R"({"enable_thinking": false})")),
            "[gMASK]<sop><|user|>hi<|assistant|></think>");
  EXPECT_EQ(ct.render(msgs, ojson(), true, ojson::parse(R"({"enable_thinking": null})")),
            "[gMASK]<sop><|user|>hi<|assistant|></think>");
  EXPECT_EQ(ct.render(msgs, ojson(), true, ojson::parse(R"({"enable_thinking": true})")),
            "[gMASK]<sop><|user|>hi<|assistant|><think>");
  const ojson hist = ojson::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a1"},
                                      {"role": "user", "content": "q"}])");
  EXPECT_EQ(ct.render(hist, ojson(), false), "[gMASK]<sop><|user|>hi<|assistant|></think>a1<|user|>q");
  EXPECT_THROW(ct.render(msgs, ojson(), true, ojson::parse(R"({"messages": []})")), latent::Error);
  EXPECT_THROW(ct.render(ojson::object(), ojson(), true), latent::Error);
}

TEST(ChatTemplate, NlohmannJsonOverload) {
  const auto ct = latent::ChatTemplate::from_string("{{ messages[0]|tojson }}");
  EXPECT_EQ(ct.render(nlohmann::json::parse(R"([{"role": "user", "content": "x"}])"), nlohmann::json(), false),
            R"({"content": "x", "role": "user"})");  // nlohmann::json sorts keys
}

TEST(ChatTemplate, GlmStringArgumentsRaiseWithoutNormalisation) {
  const auto ct = latent::ChatTemplate::from_string(
      latent::jinja::testing::read_text(latent::jinja::testing::data_path("glm5.jinja")));
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "w?"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
       "function": {"name": "get", "arguments": "{\"city\": \"Paris\", \"n\": 2}"}}]}])");
  latent::ChatRenderOptions raw;
  raw.normalize_tool_arguments = false;
  EXPECT_THROW(ct.render(msgs, ojson(), false, ojson::object(), raw), TemplateError);
  EXPECT_EQ(ct.render(msgs, ojson(), false),
            "[gMASK]<sop><|user|>w?<|assistant|></think>None<tool_call>get<arg_key>city</arg_key><arg_value>Paris"
            "</arg_value><arg_key>n</arg_key><arg_value>2</arg_value></tool_call>");
  // not JSON: left as is, and the template raises as it does in transformers
  ojson broken = msgs;
  broken[1]["tool_calls"][0]["function"]["arguments"] = "not json";
  EXPECT_THROW(ct.render(broken, ojson(), false), TemplateError);
}

TEST(ChatTemplate, LongConversation) {
  const auto ct = latent::ChatTemplate::from_string(
      latent::jinja::testing::read_text(latent::jinja::testing::data_path("glm5.jinja")));
  ojson msgs = ojson::array();
  for (int i = 0; i < 2000; ++i) {
    msgs.push_back({{"role", "user"}, {"content", "question " + std::to_string(i)}});
    msgs.push_back({{"role", "assistant"}, {"content", "answer " + std::to_string(i)}, {"reasoning_content", "r"}});
  }
  const std::string out = ct.render(msgs, ojson(), true);
  EXPECT_NE(out.find("<|user|>question 1998<|assistant|></think>answer 1998<|user|>"), std::string::npos);
  EXPECT_NE(out.find("<|user|>question 1999<|assistant|><think>r</think>answer 1999"), std::string::npos);
  EXPECT_TRUE(out.ends_with("<|assistant|><think>"));
}
