// Request validation (docs/api.md §errors, §chat-request, §messages, §tools, §completions, §tokenize): a table of
// malformed requests, each with the status, code and param the contract requires, plus the accepted shapes and the
// template-variable rules of docs/api.md §reasoning.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fake_model.h"
#include "server/api_error.h"
#include "server/request_schema.h"
#include "server/schema_check.h"
#include "server/service.h"

namespace latent::server {
namespace {

ValidationContext ctx() {
  ValidationContext c;
  c.served_names = {"glm-test", "alias"};
  c.vocab_size = 1000;
  c.max_n = 16;
  return c;
}

enum class Ep { Chat, Completions, Tokenize, Detokenize };

struct Case {
  Ep ep;
  const char* body;
  int status;
  const char* code;
  const char* param;  // nullptr = null
};

constexpr const char* M = R"("messages":[{"role":"user","content":"hi"}])";

std::string chat(const std::string& extra) { return "{" + std::string(M) + (extra.empty() ? "" : "," + extra) + "}"; }
std::string comp(const std::string& extra) {
  return R"({"prompt":"hi")" + (extra.empty() ? std::string() : "," + extra) + "}";
}

struct Row {
  Ep ep;
  std::string body;
  int status;
  std::string code;
  std::optional<std::string> param;
};

std::vector<Row> cases() {
  std::vector<Row> r;
  auto bad = [&](Ep ep, std::string body, const char* code, std::optional<std::string> param, int status = 400) {
    r.push_back({ep, std::move(body), status, code, std::move(param)});
  };
  using std::nullopt;
  // --- body -----------------------------------------------------------------------------------------------------
  for (const char* b : {"", "{", "[]", "null", "42", "\"x\"", "{\"messages\":", "{'a':1}", "{\"a\":1,}", "\xff\xfe",
                        "{\"messages\":\"\xc3\x28\"}", "tru", "{\"a\":NaN}"})
    bad(Ep::Chat, b, "invalid_json", nullopt);
  bad(Ep::Completions, "[1,2]", "invalid_json", nullopt);
  bad(Ep::Tokenize, "nope", "invalid_json", nullopt);
  // --- messages -------------------------------------------------------------------------------------------------
  bad(Ep::Chat, "{}", "missing_required_parameter", "messages");
  bad(Ep::Chat, R"({"messages":null})", "missing_required_parameter", "messages");
  bad(Ep::Chat, R"({"messages":"hi"})", "invalid_type", "messages");
  bad(Ep::Chat, R"({"messages":{}})", "invalid_type", "messages");
  bad(Ep::Chat, R"({"messages":[]})", "invalid_value", "messages");
  bad(Ep::Chat, R"({"messages":[1]})", "invalid_type", "messages[0]");
  bad(Ep::Chat, R"({"messages":[{"content":"x"}]})", "missing_required_parameter", "messages[0].role");
  bad(Ep::Chat, R"({"messages":[{"role":5,"content":"x"}]})", "invalid_type", "messages[0].role");
  bad(Ep::Chat, R"({"messages":[{"role":"bot","content":"x"}]})", "invalid_value", "messages[0].role");
  bad(Ep::Chat, R"({"messages":[{"role":"function","content":"x"}]})", "invalid_value", "messages[0].role");
  bad(Ep::Chat, R"({"messages":[{"role":"User","content":"x"}]})", "invalid_value", "messages[0].role");
  bad(Ep::Chat, R"({"messages":[{"role":"user"}]})", "missing_required_parameter", "messages[0].content");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":null}]})", "missing_required_parameter",
      "messages[0].content");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":3}]})", "invalid_type", "messages[0].content");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":{"text":"x"}}]})", "invalid_type", "messages[0].content");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":["x"]}]})", "invalid_type", "messages[0].content[0]");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":[{"text":"x"}]}]})", "missing_required_parameter",
      "messages[0].content[0].type");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
      "unsupported_parameter", "messages[0].content[0].type");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_audio"}]}]})",
      "unsupported_parameter", "messages[0].content[1].type");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", "missing_required_parameter",
      "messages[0].content[0].text");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":[{"type":"text","text":1}]}]})", "invalid_type",
      "messages[0].content[0].text");
  bad(Ep::Chat, R"({"messages":[{"role":"assistant"}]})", "missing_required_parameter", "messages[0].content");
  bad(Ep::Chat, R"({"messages":[{"role":"assistant","content":null,"tool_calls":[]}]})", "missing_required_parameter",
      "messages[0].content");
  bad(Ep::Chat, R"({"messages":[{"role":"assistant","content":null,"tool_calls":{}}]})", "invalid_type",
      "messages[0].tool_calls");
  bad(Ep::Chat, R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function"}]}]})",
      "missing_required_parameter", "messages[0].tool_calls[0].function");
  bad(Ep::Chat, R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"arguments":"{}"}}]}]})",
      "missing_required_parameter", "messages[0].tool_calls[0].function.name");
  bad(Ep::Chat,
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]})",
      "invalid_value", "messages[0].tool_calls[0].function.arguments");
  bad(Ep::Chat,
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]})",
      "invalid_value", "messages[0].tool_calls[0].function.arguments");
  bad(Ep::Chat,
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":7}}]}]})",
      "invalid_type", "messages[0].tool_calls[0].function.arguments");
  bad(Ep::Chat,
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"web","function":{"name":"f"}}]}]})",
      "invalid_value", "messages[0].tool_calls[0].type");
  bad(Ep::Chat, R"({"messages":[{"role":"assistant","content":"x","reasoning_content":5}]})", "invalid_type",
      "messages[0].reasoning_content");
  bad(Ep::Chat, R"({"messages":[{"role":"tool","content":"x"}]})", "missing_required_parameter",
      "messages[0].tool_call_id");
  bad(Ep::Chat, R"({"messages":[{"role":"tool","content":"x","tool_call_id":1}]})", "invalid_type",
      "messages[0].tool_call_id");
  bad(Ep::Chat, R"({"messages":[{"role":"user","content":"a"},{"role":"x","content":"b"}]})", "invalid_value",
      "messages[1].role");
  {
    std::string many = R"({"messages":[)";
    for (int i = 0; i < 4097; ++i) many += std::string(i ? "," : "") + R"({"role":"user","content":"x"})";
    bad(Ep::Chat, many + "]}", "invalid_value", "messages");
  }
  // --- model ----------------------------------------------------------------------------------------------------
  bad(Ep::Chat, chat(R"("model":5)"), "invalid_type", "model");
  bad(Ep::Chat, chat(R"("model":"nope")"), "model_not_found", "model", 404);
  bad(Ep::Chat, chat(R"("model":"")"), "model_not_found", "model", 404);
  bad(Ep::Completions, comp(R"("model":"GLM-TEST")"), "model_not_found", "model", 404);
  // --- stream ---------------------------------------------------------------------------------------------------
  bad(Ep::Chat, chat(R"("stream":"yes")"), "invalid_type", "stream");
  bad(Ep::Chat, chat(R"("stream":1)"), "invalid_type", "stream");
  bad(Ep::Chat, chat(R"("stream_options":{"include_usage":true})"), "invalid_value", "stream_options");
  bad(Ep::Chat, chat(R"("stream":false,"stream_options":{"include_usage":true})"), "invalid_value", "stream_options");
  bad(Ep::Chat, chat(R"("stream":true,"stream_options":[])"), "invalid_type", "stream_options");
  bad(Ep::Chat, chat(R"("stream":true,"stream_options":{"include_usage":"y"})"), "invalid_type",
      "stream_options.include_usage");
  // --- max tokens -----------------------------------------------------------------------------------------------
  bad(Ep::Chat, chat(R"("max_tokens":0)"), "invalid_value", "max_tokens");
  bad(Ep::Chat, chat(R"("max_tokens":-5)"), "invalid_value", "max_tokens");
  bad(Ep::Chat, chat(R"("max_tokens":1.5)"), "invalid_type", "max_tokens");
  bad(Ep::Chat, chat(R"("max_tokens":1e3)"), "invalid_type", "max_tokens");
  bad(Ep::Chat, chat(R"("max_tokens":"10")"), "invalid_type", "max_tokens");
  bad(Ep::Chat, chat(R"("max_tokens":true)"), "invalid_type", "max_tokens");
  bad(Ep::Chat, chat(R"("max_tokens":99999999999999999999999)"), "invalid_type", "max_tokens");
  bad(Ep::Chat, chat(R"("max_completion_tokens":0)"), "invalid_value", "max_completion_tokens");
  bad(Ep::Chat, chat(R"("max_completion_tokens":[1])"), "invalid_type", "max_completion_tokens");
  bad(Ep::Completions, comp(R"("max_tokens":-1)"), "invalid_value", "max_tokens");
  // --- sampling -------------------------------------------------------------------------------------------------
  bad(Ep::Chat, chat(R"("temperature":-0.1)"), "invalid_value", "temperature");
  bad(Ep::Chat, chat(R"("temperature":2.5)"), "invalid_value", "temperature");
  bad(Ep::Chat, chat(R"("temperature":"hot")"), "invalid_type", "temperature");
  bad(Ep::Chat, chat(R"("temperature":true)"), "invalid_type", "temperature");
  bad(Ep::Chat, chat(R"("top_p":0)"), "invalid_value", "top_p");
  bad(Ep::Chat, chat(R"("top_p":1.01)"), "invalid_value", "top_p");
  bad(Ep::Chat, chat(R"("top_k":-2)"), "invalid_value", "top_k");
  bad(Ep::Chat, chat(R"("top_k":1001)"), "invalid_value", "top_k");
  bad(Ep::Chat, chat(R"("top_k":2.0)"), "invalid_type", "top_k");
  bad(Ep::Chat, chat(R"("min_p":1.5)"), "invalid_value", "min_p");
  bad(Ep::Chat, chat(R"("presence_penalty":3)"), "invalid_value", "presence_penalty");
  bad(Ep::Chat, chat(R"("frequency_penalty":-2.1)"), "invalid_value", "frequency_penalty");
  bad(Ep::Chat, chat(R"("repetition_penalty":0)"), "invalid_value", "repetition_penalty");
  bad(Ep::Chat, chat(R"("repetition_penalty":2.5)"), "invalid_value", "repetition_penalty");
  bad(Ep::Chat, chat(R"("logit_bias":[1])"), "invalid_type", "logit_bias");
  bad(Ep::Chat, chat(R"("logit_bias":{"abc":1})"), "invalid_value", "logit_bias");
  bad(Ep::Chat, chat(R"("logit_bias":{"-1":1})"), "invalid_value", "logit_bias");
  bad(Ep::Chat, chat(R"("logit_bias":{"1000":1})"), "invalid_value", "logit_bias");
  bad(Ep::Chat, chat(R"("logit_bias":{"5":101})"), "invalid_value", "logit_bias");
  bad(Ep::Chat, chat(R"("logit_bias":{"5":"x"})"), "invalid_type", "logit_bias.5");
  bad(Ep::Chat, chat(R"("n":0)"), "invalid_value", "n");
  bad(Ep::Chat, chat(R"("n":17)"), "invalid_value", "n");
  bad(Ep::Chat, chat(R"("n":1000000)"), "invalid_value", "n");
  bad(Ep::Chat, chat(R"("n":2.5)"), "invalid_type", "n");
  bad(Ep::Chat, chat(R"("seed":"1")"), "invalid_type", "seed");
  bad(Ep::Chat, chat(R"("seed":1.5)"), "invalid_type", "seed");
  bad(Ep::Chat, chat(R"("seed":18446744073709551615)"), "invalid_value", "seed");
  // --- stop -----------------------------------------------------------------------------------------------------
  bad(Ep::Chat, chat(R"("stop":"")"), "invalid_value", "stop");
  bad(Ep::Chat, chat(R"("stop":5)"), "invalid_type", "stop");
  bad(Ep::Chat, chat(R"("stop":["a",""])"), "invalid_value", "stop[1]");
  bad(Ep::Chat, chat(R"("stop":["a",3])"), "invalid_type", "stop[1]");
  bad(Ep::Chat, chat(R"("stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"])"),
      "invalid_value", "stop");
  bad(Ep::Chat, chat("\"stop\":\"" + std::string(257, 'x') + "\""), "invalid_value", "stop");
  bad(Ep::Chat, chat(R"("stop_token_ids":5)"), "invalid_type", "stop_token_ids");
  bad(Ep::Chat, chat(R"("stop_token_ids":[1,-1])"), "invalid_value", "stop_token_ids[1]");
  bad(Ep::Chat, chat(R"("stop_token_ids":[1000])"), "invalid_value", "stop_token_ids[0]");
  bad(Ep::Chat, chat(R"("stop_token_ids":["1"])"), "invalid_type", "stop_token_ids[0]");
  bad(Ep::Chat, chat(R"("ignore_eos":"no")"), "invalid_type", "ignore_eos");
  // --- logprobs -------------------------------------------------------------------------------------------------
  bad(Ep::Chat, chat(R"("logprobs":1)"), "invalid_type", "logprobs");
  bad(Ep::Chat, chat(R"("top_logprobs":5)"), "invalid_value", "top_logprobs");
  bad(Ep::Chat, chat(R"("logprobs":true,"top_logprobs":21)"), "invalid_value", "top_logprobs");
  bad(Ep::Chat, chat(R"("logprobs":true,"top_logprobs":-1)"), "invalid_value", "top_logprobs");
  // --- tools ----------------------------------------------------------------------------------------------------
  const std::string tool = R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}})";
  bad(Ep::Chat, chat(R"("tools":[])"), "invalid_value", "tools");
  bad(Ep::Chat, chat(R"("tools":{})"), "invalid_type", "tools");
  bad(Ep::Chat, chat(R"("tools":[1])"), "invalid_type", "tools[0]");
  bad(Ep::Chat, chat(R"("tools":[{"function":{"name":"f"}}])"), "missing_required_parameter", "tools[0].type");
  bad(Ep::Chat, chat(R"("tools":[{"type":"code_interpreter"}])"), "unsupported_parameter", "tools[0].type");
  bad(Ep::Chat, chat(R"("tools":[{"type":"function"}])"), "missing_required_parameter", "tools[0].function");
  bad(Ep::Chat, chat(R"("tools":[{"type":"function","function":{}}])"), "missing_required_parameter",
      "tools[0].function.name");
  bad(Ep::Chat, chat(R"("tools":[{"type":"function","function":{"name":"bad name"}}])"), "invalid_value",
      "tools[0].function.name");
  bad(Ep::Chat, chat(R"("tools":[{"type":"function","function":{"name":")" + std::string(65, 'a') + R"("}}])"),
      "invalid_value", "tools[0].function.name");
  bad(Ep::Chat, chat(R"("tools":[)" + tool + "," + tool + "]"), "invalid_value", "tools[1].function.name");
  bad(Ep::Chat, chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])"), "invalid_type",
      "tools[0].function.parameters");
  // A malformed `parameters` schema is refused whatever tool_choice is (absent, auto, none, required, named).
  for (const char* choice : {"", R"("tool_choice":"auto",)", R"("tool_choice":"none",)", R"("tool_choice":"required",)",
                             R"("tool_choice":{"type":"function","function":{"name":"f"}},)"}) {
    for (const char* p :
         {R"({"type":"objekt","properties":5})", R"({"type":"object","properties":5})",
          R"({"type":"object","properties":{"x":{"type":"strin"}}})", R"({"type":"object","required":"x"})",
          R"({"type":"object","properties":{"x":{"$ref":"#/$defs/missing"}}})", R"({"type":"string"})"})
      bad(Ep::Chat,
          chat(std::string(choice) + R"("tools":[)" + tool +
               R"(,{"type":"function","function":{"name":"f","parameters":)" + p + "}}]"),
          "invalid_value", "tools[1].function.parameters");
  }
  bad(Ep::Chat, chat(R"("tool_choice":"auto")"), "invalid_value", "tool_choice");
  bad(Ep::Chat, chat(R"("tool_choice":"sometimes","tools":[)" + tool + "]"), "invalid_value", "tool_choice");
  bad(Ep::Chat, chat(R"("tool_choice":{"type":"function","function":{"name":"other"}},"tools":[)" + tool + "]"),
      "invalid_value", "tool_choice.function.name");
  bad(Ep::Chat, chat(R"("tool_choice":"required","guided_regex":"a","tools":[)" + tool + "]"), "invalid_value",
      "guided_regex");
  bad(Ep::Chat, chat(R"("tool_choice":5)"), "invalid_type", "tool_choice");
  bad(Ep::Chat, chat(R"("parallel_tool_calls":"no")"), "invalid_type", "parallel_tool_calls");
  // --- format / reasoning / templates ---------------------------------------------------------------------------
  bad(Ep::Chat, chat(R"("response_format":{"type":"json_schema"})"), "missing_required_parameter",
      "response_format.json_schema");
  bad(Ep::Chat, chat(R"("response_format":{"type":"json_schema","json_schema":{"schema":3}})"), "invalid_type",
      "response_format.json_schema.schema");
  bad(Ep::Chat, chat(R"("response_format":{"type":"json_schema","json_schema":{"name":""}})"), "invalid_value",
      "response_format.json_schema.name");
  bad(Ep::Chat, chat(R"("guided_choice":[])"), "invalid_value", "guided_choice");
  bad(Ep::Chat, chat(R"("guided_choice":["a",1])"), "invalid_type", "guided_choice[1]");
  bad(Ep::Chat, chat(R"("guided_regex":5)"), "invalid_type", "guided_regex");
  bad(Ep::Chat, chat(R"("guided_grammar":"")"), "invalid_value", "guided_grammar");
  bad(Ep::Chat, chat(R"("guided_json":"{not json")"), "invalid_value", "guided_json");
  bad(Ep::Chat, chat(R"("guided_regex":"a","guided_choice":["b"])"), "invalid_value", "guided_choice");
  bad(Ep::Chat, chat(R"("structured_outputs":{"regex":"a","choice":["b"]})"), "invalid_value", "structured_outputs");
  bad(Ep::Chat, chat(R"("structured_outputs":{"xml":"a"})"), "unsupported_parameter", "structured_outputs.xml");
  bad(Ep::Completions, R"({"prompt":"x","guided_regex":[1]})", "invalid_type", "guided_regex");
  bad(Ep::Chat, chat(R"("response_format":{"type":"xml"})"), "invalid_value", "response_format.type");
  bad(Ep::Chat, chat(R"("response_format":"json")"), "invalid_type", "response_format");
  bad(Ep::Chat, chat(R"("reasoning_effort":"bogus")"), "invalid_value", "reasoning_effort");
  bad(Ep::Chat, chat(R"("reasoning_effort":"HIGH")"), "invalid_value", "reasoning_effort");
  bad(Ep::Chat, chat(R"("reasoning_effort":1)"), "invalid_type", "reasoning_effort");
  bad(Ep::Chat, chat(R"("chat_template_kwargs":[])"), "invalid_type", "chat_template_kwargs");
  bad(Ep::Chat, chat(R"("chat_template_kwargs":{"enable_thinking":"no"})"), "invalid_type",
      "chat_template_kwargs.enable_thinking");
  bad(Ep::Chat, chat(R"("chat_template_kwargs":{"chat_template":"x"})"), "invalid_value",
      "chat_template_kwargs.chat_template");
  bad(Ep::Chat, chat(R"("thinking":true)"), "invalid_value", "thinking");
  bad(Ep::Chat, chat(R"("thinking":{"type":"auto"})"), "invalid_value", "thinking");
  bad(Ep::Chat, chat(R"("include_reasoning":"yes")"), "invalid_type", "include_reasoning");
  bad(Ep::Chat, chat(R"("chat_template":"{{ messages }}")"), "invalid_value", "chat_template");
  bad(Ep::Chat, chat(R"("add_generation_prompt":1)"), "invalid_type", "add_generation_prompt");
  bad(Ep::Chat, chat(R"("continue_final_message":true,"add_generation_prompt":true)"), "invalid_value",
      "continue_final_message");
  bad(Ep::Chat, chat(R"("continue_final_message":true,"add_generation_prompt":false)"), "invalid_value",
      "continue_final_message");
  bad(Ep::Chat, chat(R"("skip_special_tokens":0)"), "invalid_type", "skip_special_tokens");
  bad(Ep::Chat, chat(R"("modalities":["text","audio"])"), "unsupported_parameter", "modalities");
  bad(Ep::Chat, chat(R"("audio":{"voice":"x"})"), "unsupported_parameter", "audio");
  bad(Ep::Chat, chat(R"("functions":[{"name":"f"}])"), "unsupported_parameter", "functions");
  bad(Ep::Chat, chat(R"("function_call":"auto")"), "unsupported_parameter", "function_call");
  bad(Ep::Chat, chat(R"("prediction":{"type":"content"})"), "unsupported_parameter", "prediction");
  bad(Ep::Chat, chat(R"("thinking_token_budget":100)"), "unsupported_parameter", "thinking_token_budget");
  bad(Ep::Chat, chat(R"("include_stop_str_in_output":true)"), "unsupported_parameter", "include_stop_str_in_output");
  bad(Ep::Chat, chat(R"("echo":true)"), "unsupported_parameter", "echo");
  // --- completions ----------------------------------------------------------------------------------------------
  bad(Ep::Completions, "{}", "missing_required_parameter", "prompt");
  bad(Ep::Completions, R"({"prompt":""})", "invalid_value", "prompt");
  bad(Ep::Completions, R"({"prompt":[]})", "invalid_value", "prompt");
  bad(Ep::Completions, R"({"prompt":5})", "invalid_type", "prompt");
  bad(Ep::Completions, R"({"prompt":["a",5]})", "invalid_type", "prompt[1]");
  bad(Ep::Completions, R"({"prompt":["a",""]})", "invalid_value", "prompt[1]");
  bad(Ep::Completions, R"({"prompt":[1,2,1000]})", "invalid_value", "prompt[2]");
  bad(Ep::Completions, R"({"prompt":[1,-2]})", "invalid_value", "prompt[1]");
  bad(Ep::Completions, R"({"prompt":[[1],[]]})", "invalid_value", "prompt[1]");
  bad(Ep::Completions, R"({"prompt":[[1],[2.5]]})", "invalid_type", "prompt[1][0]");
  bad(Ep::Completions, R"({"prompt":[1.5]})", "invalid_type", "prompt");
  {
    std::string many = R"({"prompt":[)";
    for (int i = 0; i < 65; ++i) many += std::string(i ? "," : "") + "\"x\"";
    bad(Ep::Completions, many + "]}", "invalid_value", "prompt");
  }
  bad(Ep::Completions, comp(R"("logprobs":6)"), "invalid_value", "logprobs");
  bad(Ep::Completions, comp(R"("logprobs":true)"), "invalid_type", "logprobs");
  bad(Ep::Completions, comp(R"("echo":"yes")"), "invalid_type", "echo");
  bad(Ep::Completions, comp(R"("max_tokens":0)"), "invalid_value", "max_tokens");  // 0 only with echo
  bad(Ep::Completions, comp(R"("max_tokens":-1,"echo":true)"), "invalid_value", "max_tokens");
  bad(Ep::Completions, comp(R"("suffix":"x")"), "unsupported_parameter", "suffix");
  bad(Ep::Completions, comp(R"("best_of":3)"), "unsupported_parameter", "best_of");
  bad(Ep::Completions, comp(R"("n":0)"), "invalid_value", "n");
  bad(Ep::Completions, comp(R"("stream_options":{"include_usage":true})"), "invalid_value", "stream_options");
  bad(Ep::Completions, comp(R"("temperature":3)"), "invalid_value", "temperature");
  // --- tokenize / detokenize ------------------------------------------------------------------------------------
  bad(Ep::Tokenize, "{}", "invalid_value", "prompt");
  bad(Ep::Tokenize, R"({"prompt":"a","messages":[{"role":"user","content":"x"}]})", "invalid_value", "messages");
  bad(Ep::Tokenize, R"({"prompt":5})", "invalid_type", "prompt");
  bad(Ep::Tokenize, R"({"messages":[]})", "invalid_value", "messages");
  bad(Ep::Tokenize, R"({"prompt":"a","model":"zzz"})", "model_not_found", "model", 404);
  bad(Ep::Detokenize, "{}", "missing_required_parameter", "tokens");
  bad(Ep::Detokenize, R"({"tokens":"1 2"})", "invalid_type", "tokens");
  bad(Ep::Detokenize, R"({"tokens":[1,1000]})", "invalid_value", "tokens[1]");
  bad(Ep::Detokenize, R"({"tokens":[1,"2"]})", "invalid_type", "tokens[1]");
  // --- validation order (docs/api.md §validation-order): the first failing field in table order wins
  // --------------------------------------
  bad(Ep::Chat, R"({"messages":[],"temperature":9})", "invalid_value", "messages");
  bad(Ep::Chat, R"({"model":"nope","messages":[{"role":"user","content":"x"}],"temperature":9})", "invalid_value",
      "temperature");
  bad(Ep::Chat, chat(R"("temperature":9,"n":0)"), "invalid_value", "temperature");
  bad(Ep::Chat, chat(R"("top_logprobs":3,"tools":[])"), "invalid_value", "tools");
  bad(Ep::Chat, chat(R"("model":"nope","stream_options":{})"), "invalid_value", "stream_options");
  return r;
}

void run_case(const Row& c) {
  try {
    const ojson body = parse_json_body(c.body);
    switch (c.ep) {
      case Ep::Chat: parse_chat_request(body, ctx()); break;
      case Ep::Completions: parse_completion_request(body, ctx()); break;
      case Ep::Tokenize: parse_tokenize_request(body, ctx()); break;
      case Ep::Detokenize: parse_detokenize_request(body, ctx()); break;
    }
    ADD_FAILURE() << "accepted: " << c.body.substr(0, 200);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, c.status) << c.body.substr(0, 200) << " -> " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body.substr(0, 200) << " -> " << e.message;
    EXPECT_EQ(e.param, c.param) << c.body.substr(0, 200) << " -> " << e.message;
    const auto j = e.body();
    ASSERT_TRUE(j.contains("error"));
    EXPECT_EQ(j["error"].size(), 4u);
    EXPECT_TRUE(j["error"]["code"].is_string());
  }
}

TEST(RequestSchema, MalformedRequestsGetTheSpecError) {
  const auto all = cases();
  EXPECT_GE(all.size(), 150u);
  for (const auto& c : all) run_case(c);
}

TEST(RequestSchema, ValidChatRequest) {
  const ojson b = parse_json_body(R"({
    "model": "alias", "stream": true, "stream_options": {"include_usage": true, "other": 1},
    "messages": [
      {"role": "developer", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "bob"},
      {"role": "assistant", "content": null, "reasoning": "think",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.1,
    "logit_bias": {"5": -100, "7": 2.5}, "n": 16, "seed": -9223372036854775808, "stop": ["x", "yy"],
    "stop_token_ids": [3], "logprobs": true, "top_logprobs": 20, "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "response_format": {"type": "text"}, "reasoning_effort": "none", "modalities": ["text"],
    "user": "u", "metadata": {"k": "v"}, "priority": 3, "lora": null, "thinking_token_budget": 0})");
  const ChatRequest r = parse_chat_request(b, ctx());
  EXPECT_EQ(r.c.model, "alias");
  EXPECT_TRUE(r.c.stream && r.c.include_usage);
  EXPECT_EQ(*r.c.max_tokens, 7);
  EXPECT_EQ(r.c.max_tokens_param, "max_completion_tokens");
  EXPECT_EQ(r.c.logit_bias.size(), 2u);
  EXPECT_EQ(r.c.n, 16);
  EXPECT_EQ(*r.c.seed, INT64_MIN);
  EXPECT_EQ(r.tool_choice, ToolChoice::Auto);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.messages[2]["reasoning_content"], "think");
  EXPECT_TRUE(r.messages[2]["tool_calls"][0]["function"]["arguments"].is_object());
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(r.c.unknown_fields, 2);  // priority, lora
  const ojson v = chat_template_variables(r);
  EXPECT_EQ(v["enable_thinking"], false);
  EXPECT_EQ(v["thinking"], false);
  EXPECT_EQ(v["reasoning_effort"], "none");
}

TEST(RequestSchema, ThinkingPrecedence) {
  auto vars = [](const std::string& extra) {
    return chat_template_variables(parse_chat_request(parse_json_body(chat(extra)), ctx()));
  };
  EXPECT_FALSE(vars("").contains("enable_thinking"));  // template default
  EXPECT_EQ(vars(R"("reasoning_effort":"high")")["enable_thinking"], true);
  EXPECT_EQ(vars(R"("reasoning_effort":"high")")["reasoning_effort"], "high");
  EXPECT_EQ(vars(R"("thinking":{"type":"disabled"},"reasoning_effort":"high")")["enable_thinking"], false);
  EXPECT_EQ(
      vars(R"("chat_template_kwargs":{"enable_thinking":true},"thinking":{"type":"disabled"})")["enable_thinking"],
      true);
  EXPECT_EQ(vars(R"("chat_template_kwargs":{"thinking":false})")["enable_thinking"], false);
  EXPECT_FALSE(vars(R"("chat_template_kwargs":{"enable_thinking":null})").contains("enable_thinking"));
  EXPECT_EQ(vars(R"("chat_template_kwargs":{"clear_thinking":false})")["clear_thinking"], false);
}

TEST(RequestSchema, StructuredOutputFields) {
  using K = StructuredSpec::Kind;
  auto spec = [](const std::string& extra) {
    return parse_chat_request(parse_json_body(chat(extra)), ctx()).structured;
  };
  EXPECT_EQ(spec("").kind, K::None);
  EXPECT_EQ(spec(R"("response_format":{"type":"text"})").kind, K::None);
  EXPECT_EQ(spec(R"("response_format":{"type":"json_object"})").kind, K::JsonObject);
  auto s = spec(
      R"("response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"integer"}}})");
  EXPECT_EQ(s.kind, K::JsonSchema);
  EXPECT_EQ(s.schema, ojson::parse(R"({"type":"integer"})"));
  EXPECT_EQ(s.param, "response_format.json_schema.schema");
  EXPECT_EQ(spec(R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})").kind, K::JsonObject);
  s = spec(R"("guided_json":"{\"type\":\"string\"}")");
  EXPECT_EQ(s.kind, K::JsonSchema);
  EXPECT_EQ(s.schema["type"], "string");
  s = spec(R"("guided_choice":["a","b"])");
  EXPECT_EQ(s.kind, K::Choice);
  EXPECT_EQ(s.choices, (std::vector<std::string>{"a", "b"}));
  s = spec(R"("structured_outputs":{"regex":"[0-9]+"})");
  EXPECT_EQ(s.kind, K::Regex);
  EXPECT_EQ(s.text, "[0-9]+");
  EXPECT_EQ(s.param, "structured_outputs.regex");
  EXPECT_EQ(spec(R"("guided_grammar":"root ::= \"a\"")").kind, K::Grammar);
  const std::string tool = R"({"type":"function","function":{"name":"get_weather"}})";
  auto r = parse_chat_request(parse_json_body(chat(R"("tool_choice":"required","tools":[)" + tool + "]")), ctx());
  EXPECT_EQ(r.tool_choice, ToolChoice::Required);
  r = parse_chat_request(
      parse_json_body(
          chat(R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},"tools":[)" + tool + "]")),
      ctx());
  EXPECT_EQ(r.tool_choice, ToolChoice::Named);
  EXPECT_EQ(r.tool_choice_name, "get_weather");
  EXPECT_EQ(r.c.unknown_fields, 0);
  auto c = parse_completion_request(parse_json_body(R"({"prompt":"x","guided_choice":["y"]})"), ctx());
  EXPECT_EQ(c.structured.kind, K::Choice);
}

TEST(RequestSchema, ToolChoiceNoneHidesTools) {
  const std::string tool = R"({"type":"function","function":{"name":"f"}})";
  auto r = parse_chat_request(parse_json_body(chat(R"("tool_choice":"none","tools":[)" + tool + "]")), ctx());
  EXPECT_EQ(r.tool_choice, ToolChoice::None);
  r = parse_chat_request(parse_json_body(chat(R"("tools":[)" + tool + "]")), ctx());
  EXPECT_EQ(r.tool_choice, ToolChoice::Auto);
}

TEST(RequestSchema, ValidCompletionShapes) {
  auto p = [](const std::string& body) { return parse_completion_request(parse_json_body(body), ctx()); };
  EXPECT_EQ(p(R"({"prompt":"a"})").prompt_texts.size(), 1u);
  EXPECT_EQ(p(R"({"prompt":["a","b"]})").prompt_texts.size(), 2u);
  auto t = p(R"({"prompt":[1,2,3],"best_of":1,"echo":false,"logprobs":2})");
  EXPECT_TRUE(t.prompt_is_tokens);
  EXPECT_EQ(t.prompt_tokens[0].size(), 3u);
  EXPECT_EQ(*t.logprobs, 2);
  EXPECT_FALSE(t.echo);
  auto e = p(R"({"prompt":"a","echo":true,"max_tokens":0,"logprobs":1})");
  EXPECT_TRUE(e.echo);
  EXPECT_EQ(*e.c.max_tokens, 0);
  EXPECT_EQ(p(R"({"prompt":[[1],[2,3]]})").prompt_tokens.size(), 2u);
  EXPECT_EQ(p(R"({"prompt":"a"})").c.model, "glm-test");
}

TEST(RequestSchema, ContentTypeIsNotRequiredAndNullIsAbsent) {
  auto r = parse_chat_request(parse_json_body(chat(R"("temperature":null,"stop":null,"tools":null,"n":null)")), ctx());
  EXPECT_FALSE(r.c.temperature.has_value());
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_EQ(r.c.n, 1);
}

TEST(RequestSchema, EveryJsonRejectionIsInvalidJsonWithAPosition) {
  for (const char* b : {R"({"a":1e400})", R"({"metadata":{"x":[1,-1e999]}})", R"({"a":})", "{\"a\":\"\xff\"}", "[1]"}) {
    try {
      parse_json_body(b);
      ADD_FAILURE() << "accepted " << b;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << b;
      EXPECT_EQ(e.code, "invalid_json") << b;
      if (std::string(b) != "[1]") {
        EXPECT_TRUE(e.message.find("byte") != std::string::npos || e.message.find("column") != std::string::npos)
            << e.message;
      }
    }
  }
  EXPECT_EQ(parse_json_body(R"({"a":1e300})")["a"].get<double>(), 1e300);
}

TEST(RequestSchema, DefaultSamplingFlagUsesTheRequestRules) {
  auto d = SamplingDefaults::from_flag(R"({"temperature":0.6,"top_k":20})", "--default-sampling-params");
  EXPECT_EQ(*d.temperature, 0.6);
  EXPECT_EQ(*d.top_k, 20);
  for (const char* bad :
       {R"({"temperture":0.6})", R"({"temperature":9})", R"({"top_k":1.5})", R"({"top_p":0})", "[1]", "{"}) {
    try {
      SamplingDefaults::from_flag(bad, "--default-sampling-params");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const latent::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--default-sampling-params: ", 0), 0u) << e.what();
    }
  }
  try {
    SamplingDefaults::from_flag(R"({"temperture":0.6})", "--default-sampling-params");
  } catch (const latent::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'temperature'"), std::string::npos) << e.what();
  }
}

// The prompt is tokenized only as far as needed to know it exceeds the context.
TEST(RequestSchema, BudgetedEncodingStopsEarly) {
  latent::testing::FakeCodec codec;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "ab ";
  auto b = encode_with_budget(codec, text, false, 100);
  EXPECT_TRUE(b.over);
  EXPECT_GT(b.ids.size(), 100u);
  EXPECT_LT(b.ids.size(), text.size() / 4);  // far from the whole text
  auto whole = encode_with_budget(codec, "ab ab", false, 100);
  EXPECT_FALSE(whole.over);
  EXPECT_EQ(whole.ids, codec.encode("ab ab", false));
  auto exact = encode_with_budget(codec, text.substr(0, 600), false, 1000);
  EXPECT_FALSE(exact.over);
  EXPECT_EQ(exact.ids, codec.encode(text.substr(0, 600), false));
  // A text without whitespace cannot be cut safely; its length alone (no token covers more than the longest token's
  // bytes) decides, without tokenizing it.
  const size_t tmax = max_token_bytes(codec);
  ASSERT_GT(tmax, 1u);
  const std::string solid(4 * tmax * 109 + 1, 'x');
  auto len = encode_with_budget(codec, solid, false, 100, tmax);
  EXPECT_TRUE(len.over);
  EXPECT_TRUE(len.ids.empty());
  EXPECT_GT(len.at_least, 100);
  EXPECT_FALSE(encode_with_budget(codec, solid, false, 100).ids.empty());  // without the bound: tokenized
  // Never a false refusal: the longest token repeated up to the limit still fits, and is tokenized in full.
  std::string longest;
  for (int32_t id = 0; id < codec.id_limit(); ++id)
    if (codec.token_bytes(id).size() == tmax) longest = codec.token_bytes(id);
  std::string full;
  for (int i = 0; i < 100; ++i) full += longest;
  auto fits = encode_with_budget(codec, full, false, 100, tmax);
  EXPECT_FALSE(fits.over);
  EXPECT_EQ(fits.ids, codec.encode(full, false));
}

}  // namespace
}  // namespace latent::server

namespace latent::server {
namespace {

// json_schema_problem: the shape of every draft keyword, recursively, with the location of the first problem; valid
// keywords that constrained decoding does not implement (minimum, format) and unknown keywords pass.
TEST(SchemaCheck, MalformedSchemasNameTheLocationAndTheProblem) {
  struct Bad {
    const char* schema;
    const char* needle;
  };
  const Bad bad[] = {
      {R"({"type":"objekt"})", "at #: 'objekt' is not a JSON Schema type"},
      {R"({"type":["string","string"]})", "'type' lists 'string' twice"},
      {R"({"type":[]})", "'type' must not be an empty array"},
      {R"({"type":5})", "'type' must be a type name"},
      {R"({"properties":5})", "at #: 'properties' must be an object whose values are schemas (got a number)"},
      {R"({"properties":{"a/b":{"type":"x"}}})", "at #/properties/a~1b: 'x' is not a JSON Schema type"},
      {R"({"properties":{"a":3}})", "at #/properties/a: a schema must be an object or a boolean (got a number)"},
      {R"({"items":{"items":{"type":"nope"}}})", "at #/items/items: 'nope'"},
      {R"({"items":[{"type":"string"},{"minItems":-1}]})", "at #/items/1: 'minItems' must be a non-negative integer"},
      {R"({"required":"x"})", "'required' must be an array of strings (got a string)"},
      {R"({"required":["x",1]})", "'required' must be an array of strings (item 1 is a number)"},
      {R"({"required":["x","x"]})", "'required' lists 'x' twice"},
      {R"({"anyOf":[]})", "'anyOf' must be a non-empty array of schemas"},
      {R"({"oneOf":[{"type":"string"},{"enum":3}]})", "at #/oneOf/1: 'enum' must be an array"},
      {R"({"allOf":{}})", "'allOf' must be a non-empty array of schemas"},
      {R"({"maxLength":1.5})", "'maxLength' must be a non-negative integer"},
      {R"({"minimum":"0"})", "'minimum' must be a number (got a string)"},
      {R"({"multipleOf":0})", "'multipleOf' must be a number greater than 0"},
      {R"({"uniqueItems":"yes"})", "'uniqueItems' must be a boolean"},
      {R"({"pattern":7})", "'pattern' must be a string"},
      {R"({"additionalProperties":"no"})", "at #/additionalProperties: a schema must be an object or a boolean"},
      {R"({"$ref":"#/definitions/a"})", "'$ref' '#/definitions/a' does not resolve"},
      {R"({"$defs":{"a":{"type":"object"}},"$ref":"#/$defs/b"})", "does not resolve"},
      {R"({"$ref":5})", "'$ref' must be a string"},
      {R"({"dependentRequired":{"a":"b"}})", "'a' must be an array of strings"},
      {R"({"dependencies":{"a":5}})", "at #/dependencies/a: a schema must be an object or a boolean"},
      {R"({"not":[]})", "at #/not: a schema must be an object or a boolean (got an array)"},
      {"[]", "at #: a schema must be an object or a boolean (got an array)"},
  };
  for (const Bad& b : bad) {
    const std::string p = json_schema_problem(ojson::parse(b.schema));
    EXPECT_NE(p.find(b.needle), std::string::npos) << b.schema << " -> '" << p << "'";
  }
}

TEST(SchemaCheck, WellFormedSchemasPass) {
  for (const char* s : {
           "{}",
           "true",
           "false",
           R"({"type":"object"})",
           R"({"type":["string","null"]})",
           R"({"type":"object","properties":{"x":{"type":"integer","minimum":0,"maximum":3,"exclusiveMaximum":true}},
               "required":["x"],"additionalProperties":false})",
           R"({"type":"object","properties":{"d":{"type":"string","format":"date-time","pattern":"^\\d+$"}}})",
           R"({"$defs":{"n":{"type":"number","multipleOf":0.5}},"type":"object",
               "properties":{"n":{"$ref":"#/$defs/n"}}})",
           R"({"definitions":{"a~b":{"type":"string"}},"properties":{"x":{"$ref":"#/definitions/a~0b"}}})",
           R"({"properties":{"r":{"$ref":"#"}}})",
           R"({"properties":{"r":{"$ref":"https://example.com/s.json"}}})",
           R"({"items":[{"type":"string"}],"additionalItems":false,"minItems":2.0})",
           R"({"prefixItems":[{"const":1}],"items":false,"contains":{"type":"number"},"minContains":1})",
           R"({"if":{"required":["a"]},"then":{"required":["b"]},"else":true,"not":{"type":"null"}})",
           R"({"dependencies":{"a":["b"],"c":{"required":["d"]}},"dependentRequired":{"e":["f"]}})",
           R"({"x-custom":{"anything":[1,2]},"enum":[],"const":null,"default":5,"examples":[1],"deprecated":true})",
       })
    EXPECT_EQ(json_schema_problem(ojson::parse(s)), "") << s;
}

TEST(SchemaCheck, ToolErrorNamesTheToolAndTheSchemaError) {
  const ojson b = parse_json_body(R"({"messages":[{"role":"user","content":"hi"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"objekt","properties":5}}}]})");
  try {
    parse_chat_request(b, ctx());
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_value");
    EXPECT_EQ(e.param, "tools[0].function.parameters");
    EXPECT_NE(e.message.find("Invalid schema for function 'get_weather': at #: 'objekt' is not a JSON Schema type"),
              std::string::npos)
        << e.message;
  }
}

}  // namespace
}  // namespace latent::server
