// The HTTP server end to end over the fake codec and script engine: endpoints, errors, auth, SSE framing,
// stream / non-stream equality, tool calls, reasoning, context limits, queue limit, disconnects, shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "server_fixture.h"

namespace latent::server {
namespace {

using namespace std::chrono_literals;
using latent::testing::Headers;
using latent::testing::HttpResult;
using latent::testing::RawConn;
using latent::testing::script;
using latent::testing::ServerFixture;
using ojson = nlohmann::ordered_json;

ojson chat_body(const std::string& user, const std::string& extra = "") {
  ojson b = ojson::parse("{" + extra + (extra.empty() ? "" : ",") + R"("messages":[]})");
  b["messages"].push_back({{"role", "user"}, {"content", user}});
  return b;
}

HttpResult post(ServerFixture& f, const std::string& path, const ojson& body, Headers h = {}) {
  auto c = f.client();
  return c.Post(path.c_str(), h, body.dump(), "application/json");
}

// Parses an SSE body into its data payloads (comments skipped).
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < body.size()) {
    size_t e = body.find("\n\n", p);
    if (e == std::string::npos) break;
    const std::string ev = body.substr(p, e - p);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    p = e + 2;
  }
  return out;
}

void expect_error(const HttpResult& r, int status, const std::string& code) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  const auto j = ojson::parse(r->body);
  ASSERT_TRUE(j.contains("error")) << r->body;
  EXPECT_EQ(j["error"].size(), 4u);
  EXPECT_EQ(j["error"]["code"], code) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("application/json", 0), 0u);
}

TEST(HttpServer, HealthVersionModelsMetrics) {
  ServerFixture f;
  auto c = f.client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(ojson::parse(r->body)["status"], "ok");
  EXPECT_EQ(r->get_header_value("X-Request-Id").size(), 32u);
  r = c.Head("/health");
  EXPECT_EQ(r->status, 200);
  r = c.Get("/version");
  EXPECT_TRUE(ojson::parse(r->body).contains("git_sha"));
  r = c.Get("/v1/models");
  auto j = ojson::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "fake-model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 256);
  EXPECT_EQ(j["data"][0]["meta"]["tool_parser"], "glm47");
  r = c.Get("/v1/models/fake-alias");
  EXPECT_EQ(r->status, 200);
  expect_error(c.Get("/v1/models/nope"), 404, "not_found");
  r = c.Get("/metrics");
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("latent:num_requests_running{model_name=\"fake-model\"} 0"), std::string::npos);
  EXPECT_NE(r->body.find("latent:time_to_first_token_seconds_bucket"), std::string::npos);
  Headers h = {{"X-Request-Id", "abc-123"}};
  r = c.Get("/health", h);
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "abc-123");
}

TEST(HttpServer, RoutingErrors) {
  ServerFixture f;
  auto c = f.client();
  expect_error(c.Get("/nope"), 404, "not_found");
  expect_error(c.Post("/v1/responses", "{}", "application/json"), 404, "not_found");
  auto r = c.Get("/v1/chat/completions");
  expect_error(r, 405, "method_not_allowed");
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  expect_error(c.Post("/health", "", "text/plain"), 405, "method_not_allowed");
  expect_error(c.Post("/v1/chat/completions", "not json", "text/plain"), 400, "invalid_json");
  expect_error(c.Post("/v1/chat/completions", "{\"messages\":[]}", "application/x-www-form-urlencoded"), 400,
               "invalid_value");
}

TEST(HttpServer, CorsPreflightAndMetricsFlags) {
  HttpOptions ho;
  ho.allowed_origins = "https://a.example, https://b.example";
  ho.metrics_enabled = false;
  ho.api_keys = {"k"};
  ServerFixture f(ho);
  auto c = f.client();
  Headers h = {{"Origin", "https://b.example"}, {"Access-Control-Request-Method", "POST"}};
  auto r = c.Options("/v1/chat/completions", h);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);  // no auth for preflight
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "https://b.example");
  EXPECT_NE(r->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  r = c.Get("/health", {{"Origin", "https://evil.example"}});
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "");
  expect_error(c.Get("/metrics"), 404, "not_found");  // --no-metrics
  HttpOptions ho2;
  ho2.api_keys = {"k"};
  ho2.metrics_require_auth = true;
  ServerFixture g(ho2);
  expect_error(g.client().Get("/metrics"), 401, "invalid_api_key");
  EXPECT_EQ(g.client().Get("/metrics", {{"Authorization", "Bearer k"}})->status, 200);
}

TEST(HttpServer, BodyLimit) {
  HttpOptions ho;
  ho.max_request_bytes = 1000;
  ServerFixture f(ho);
  auto r = post(f, "/v1/chat/completions", chat_body(std::string(2000, 'x')));
  expect_error(r, 413, "request_too_large");
  r = post(f, "/v1/chat/completions", chat_body("hi", R"("max_tokens":2)"));
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, AuthBeforeEverything) {
  HttpOptions ho;
  ho.api_keys = {"secret-key", "other"};
  ho.max_request_bytes = 1000;
  ServerFixture f(ho);
  auto c = f.client();
  auto r = c.Post("/v1/chat/completions", "{bad json", "application/json");
  expect_error(r, 401, "invalid_api_key");
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  expect_error(c.Post("/v1/chat/completions", std::string(5000, 'x'), "application/json"), 401, "invalid_api_key");
  Headers wrong = {{"Authorization", "Bearer secret-kez"}};
  expect_error(c.Post("/tokenize", wrong, "{}", "application/json"), 401, "invalid_api_key");
  expect_error(c.Get("/v1/models"), 401, "invalid_api_key");
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/version")->status, 200);
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  Headers good = {{"Authorization", "Bearer secret-key"}};
  EXPECT_EQ(c.Get("/v1/models", good)->status, 200);
  Headers xkey = {{"x-api-key", "other"}};
  EXPECT_EQ(c.Get("/v1/models", xkey)->status, 200);
  expect_error(c.Post("/v1/chat/completions", good, "{bad", "application/json"), 400, "invalid_json");
}

TEST(HttpServer, ChatReasoningAndContent) {
  ServerFixture f;
  f.engine.set_script("capital", script("The user asks.</think>Paris."));
  auto r = post(f, "/v1/chat/completions", chat_body("[[capital]]"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = ojson::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().substr(0, 9), "chatcmpl-");
  EXPECT_EQ(j["id"].get<std::string>().size(), 9u + 32u);
  EXPECT_EQ(j["model"], "fake-model");
  const auto& m = j["choices"][0]["message"];
  EXPECT_EQ(m["content"], "Paris.");
  EXPECT_EQ(m["reasoning_content"], "The user asks.");
  EXPECT_EQ(m["reasoning"], "The user asks.");
  EXPECT_FALSE(m.contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const auto& u = j["usage"];
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_EQ(u["completion_tokens_details"]["reasoning_tokens"], 14);
  EXPECT_EQ(u["completion_tokens"], 14 + 1 + 6 + 1);
  // /tokenize gives the same prompt count.
  auto t = post(f, "/tokenize", ojson{{"messages", chat_body("[[capital]]")["messages"]}, {"return_token_strs", true}});
  auto tj = ojson::parse(t->body);
  EXPECT_EQ(tj["count"], u["prompt_tokens"]);
  EXPECT_EQ(tj["token_strs"].back(), "<think>");
  // Thinking off: prompt ends with </think>; the reply has no reasoning.
  f.engine.set_script("plain", script("Hi."));
  r = post(f, "/v1/chat/completions", chat_body("[[plain]]", R"("reasoning_effort":"none")"));
  j = ojson::parse(r->body);
  EXPECT_TRUE(j["choices"][0]["message"]["reasoning_content"].is_null());
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi.");
  t = post(
      f, "/tokenize",
      ojson{
          {"messages", chat_body("x")["messages"]}, {"thinking", {{"type", "disabled"}}}, {"return_token_strs", true}});
  EXPECT_EQ(ojson::parse(t->body)["token_strs"].back(), "</think>");
  // include_reasoning:false omits the fields.
  r = post(f, "/v1/chat/completions", chat_body("[[capital]]", R"("include_reasoning":false)"));
  j = ojson::parse(r->body);
  EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content"));
}

TEST(HttpServer, StreamFramingAndEquality) {
  ServerFixture f;
  f.engine.set_script(
      "s", script("Think.</think>Hello <tool_call>get_x<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"));
  ojson b = chat_body("[[s]]");
  b["tools"] = ojson::parse(R"([{"type":"function","function":{"name":"get_x"}}])");
  auto nr = post(f, "/v1/chat/completions", b);
  const auto nj = ojson::parse(nr->body);
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  auto sr = post(f, "/v1/chat/completions", b);
  ASSERT_EQ(sr->status, 200);
  EXPECT_EQ(sr->get_header_value("Content-Type"), "text/event-stream; charset=utf-8");
  EXPECT_EQ(sr->get_header_value("Cache-Control"), "no-cache");
  auto ev = sse_events(sr->body);
  ASSERT_GE(ev.size(), 4u);
  EXPECT_EQ(ev.back(), "[DONE]");
  auto first = ojson::parse(ev[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  std::string content, reasoning, args, name;
  std::string finish;
  for (size_t i = 0; i + 2 < ev.size(); ++i) {
    auto c = ojson::parse(ev[i]);
    EXPECT_EQ(c["id"], first["id"]);
    EXPECT_EQ(c["choices"].size(), 1u);
    const auto& ch = c["choices"][0];
    EXPECT_TRUE(ch.contains("finish_reason"));
    if (!ch["finish_reason"].is_null()) {
      EXPECT_EQ(i + 3, ev.size());  // last chunk before the usage chunk
      EXPECT_TRUE(ch["delta"].empty());
      finish = ch["finish_reason"];
    }
    const auto& d = ch["delta"];
    if (d.contains("content") && i > 0) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const auto& tc : d["tool_calls"]) {
        if (tc["function"].contains("name")) {
          name = tc["function"]["name"];
          EXPECT_EQ(tc["function"]["arguments"], "");
        } else {
          args += tc["function"]["arguments"].get<std::string>();
        }
      }
  }
  auto usage = ojson::parse(ev[ev.size() - 2]);
  EXPECT_TRUE(usage["choices"].is_array() && usage["choices"].empty());
  // The streamed request came second: its full prompt blocks (64 of 65 tokens) came from the prefix cache.
  EXPECT_EQ(nj["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
  auto u1 = usage["usage"], u2 = nj["usage"];
  u1.erase("prompt_tokens_details");
  u2.erase("prompt_tokens_details");
  EXPECT_EQ(u1, u2);
  const auto& m = nj["choices"][0]["message"];
  EXPECT_EQ(content, m["content"]);
  EXPECT_EQ(reasoning, m["reasoning_content"]);
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(nj["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(name, m["tool_calls"][0]["function"]["name"]);
  EXPECT_EQ(args, m["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(args, R"({"a": 1})");
  EXPECT_EQ(m["content"], "Hello ");
}

TEST(HttpServer, StopStringsAndLogprobs) {
  ServerFixture f;
  f.engine.set_script("stop", script("</think>abc END def"));
  auto r = post(f, "/v1/chat/completions", chat_body("[[stop]]", R"("stop":["END"],"logprobs":true,"top_logprobs":2)"));
  auto j = ojson::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "abc ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const auto& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_GE(lp.size(), 4u);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(lp[1]["bytes"].is_array());
  auto s = post(f, "/v1/chat/completions", chat_body("[[stop]]", R"("stop":["END"],"stream":true)"));
  std::string content;
  for (const auto& e : sse_events(s->body)) {
    if (e == "[DONE]") continue;
    auto c = ojson::parse(e);
    const auto& d = c["choices"][0]["delta"];
    if (d.contains("content")) {
      const std::string piece = d["content"];
      EXPECT_EQ(piece.find('E'), std::string::npos) << piece;
      content += piece;
    }
  }
  EXPECT_EQ(content, "abc ");
}

TEST(HttpServer, ContextLength) {
  ServerFixture f;
  auto r = post(f, "/v1/chat/completions", chat_body(std::string(300, 'x')));
  expect_error(r, 400, "context_length_exceeded");
  EXPECT_EQ(ojson::parse(r->body)["error"]["param"], "messages");
  r = post(f, "/v1/chat/completions", chat_body("hi", R"("max_completion_tokens":1000)"));
  expect_error(r, 400, "context_length_exceeded");
  EXPECT_EQ(ojson::parse(r->body)["error"]["param"], "max_completion_tokens");
  EXPECT_NE(ojson::parse(r->body)["error"]["message"].get<std::string>().find("maximum context length is 256 tokens"),
            std::string::npos);
  r = post(f, "/v1/chat/completions", chat_body("hi", R"("max_tokens":1000)"));
  EXPECT_EQ(ojson::parse(r->body)["error"]["param"], "max_tokens");
  ServiceOptions so;
  so.clamp_max_tokens = true;
  ServerFixture g({}, {}, so);
  r = post(g, "/v1/chat/completions", chat_body("hi", R"("max_tokens":1000)"));
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(ojson::parse(r->body)["choices"][0]["finish_reason"], "length");
}

TEST(HttpServer, CompletionsAndTokenizeRoundTrip) {
  ServerFixture f;
  auto r = post(f, "/v1/completions", ojson::parse(R"({"prompt":["ab","cd"],"n":2,"max_tokens":3,"temperature":0})"));
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = ojson::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 4u);
  EXPECT_EQ(j["choices"][0]["text"], j["choices"][1]["text"]);  // greedy n=2
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>().size(), 3u);
  EXPECT_EQ(j["choices"][3]["index"], 3);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  r = post(f, "/v1/completions", ojson::parse(R"({"prompt":"ab","stream":true,"max_tokens":4,"logprobs":1})"));
  auto ev = sse_events(r->body);
  ASSERT_EQ(ev.back(), "[DONE]");
  std::string text;
  for (const auto& e : ev)
    if (e != "[DONE]") text += ojson::parse(e)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text.size(), 4u);
  r = post(f, "/tokenize", ojson{{"prompt", "a<|user|>b"}});
  j = ojson::parse(r->body);
  EXPECT_EQ(j["count"], 3);
  EXPECT_EQ(j["max_model_len"], 256);
  r = post(f, "/detokenize", ojson{{"tokens", j["tokens"]}});
  EXPECT_EQ(ojson::parse(r->body)["prompt"], "a<|user|>b");
}

TEST(HttpServer, ManyMalformedRequestsThenStillServing) {
  ServerFixture f;
  const char* bodies[] = {"",
                          "{",
                          "[1]",
                          R"({"messages":[]})",
                          R"({"messages":[{"role":"x","content":"y"}]})",
                          R"({"messages":[{"role":"user","content":"y"}],"n":99})",
                          R"({"messages":[{"role":"user","content":"y"}],"model":"zz"})",
                          R"({"messages":[{"role":"user","content":"y"}],"max_tokens":-1})",
                          R"({"messages":[{"role":"user","content":"y"}],"temperature":"x"})"};
  auto c = f.client();
  for (int round = 0; round < 12; ++round)
    for (const char* b : bodies) {
      auto r = c.Post("/v1/chat/completions", b, "application/json");
      ASSERT_TRUE(r);
      EXPECT_GE(r->status, 400);
      EXPECT_LT(r->status, 500);
    }
  auto r = post(f, "/v1/chat/completions", chat_body("hi", R"("max_tokens":3)"));
  EXPECT_EQ(r->status, 200);
  auto m = c.Get("/metrics");
  EXPECT_NE(m->body.find("requests_rejected_total{model_name=\"fake-model\",reason=\"validation\"}"),
            std::string::npos);
}

TEST(HttpServer, ModelLoadingIs503) {
  ServerFixture f({}, {}, {}, /*ready=*/false);
  auto c = f.client();
  expect_error(c.Get("/health"), 503, "model_loading");
  expect_error(c.Post("/v1/chat/completions", chat_body("x").dump(), "application/json"), 503, "model_loading");
  expect_error(c.Get("/v1/models"), 503, "model_loading");
  f.http->set_service(f.svc);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(HttpServer, QueueFullIs503WithRetryAfter) {
  SchedulerOptions so;
  so.max_num_seqs = 1;
  so.max_queue_len = 1;
  ServerFixture f({}, so);
  f.engine.delay_ms = 5;
  std::thread t1([&] { post(f, "/v1/chat/completions", chat_body("a", R"("max_tokens":60)")); });
  std::this_thread::sleep_for(100ms);
  std::thread t2([&] { post(f, "/v1/chat/completions", chat_body("b", R"("max_tokens":5)")); });
  std::this_thread::sleep_for(100ms);
  auto r = post(f, "/v1/chat/completions", chat_body("c", R"("max_tokens":5)"));
  expect_error(r, 503, "server_is_overloaded");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  t1.join();
  t2.join();
}

int64_t metric(ServerFixture& f, const std::string& name) {
  auto r = f.client().Get("/metrics");
  const std::string key = "latent:" + name + "{model_name=\"fake-model\"} ";
  const size_t p = r->body.find(key);
  if (p == std::string::npos) return -1;
  return std::stoll(r->body.substr(p + key.size()));
}

TEST(HttpServer, DisconnectFreesSequenceNonStreaming) {
  ServerFixture f;
  f.engine.delay_ms = 5;
  {
    RawConn conn(f.port, "/v1/chat/completions", chat_body("long", R"("max_tokens":200)").dump());
    for (int i = 0; i < 100 && metric(f, "num_requests_running") != 1; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(metric(f, "num_requests_running"), 1);
    EXPECT_GT(metric(f, "kv_cache_blocks_used"), 0);
    conn.close_now();
  }
  const auto t0 = std::chrono::steady_clock::now();
  while ((metric(f, "num_requests_running") != 0 || metric(f, "kv_cache_blocks_used") != 0) &&
         std::chrono::steady_clock::now() - t0 < 2s)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(metric(f, "num_requests_running"), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(metric(f, "kv_cache_blocks_used"), 0);
  EXPECT_NE(f.client().Get("/metrics")->body.find("reason=\"client_disconnect\"} 1"), std::string::npos);
}

TEST(HttpServer, DisconnectFreesSequenceStreaming) {
  ServerFixture f;
  f.engine.delay_ms = 5;
  {
    auto b = chat_body("long", R"("max_tokens":200,"stream":true)");
    RawConn conn(f.port, "/v1/chat/completions", b.dump());
    const std::string head = conn.read_some();
    EXPECT_NE(head.find("200"), std::string::npos);
    conn.close_now();
  }
  const auto t0 = std::chrono::steady_clock::now();
  while ((metric(f, "num_requests_running") != 0 || metric(f, "kv_cache_blocks_used") != 0) &&
         std::chrono::steady_clock::now() - t0 < 2s)
    std::this_thread::sleep_for(10ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(metric(f, "num_requests_running"), 0);
  EXPECT_EQ(metric(f, "kv_cache_blocks_used"), 0);
}

TEST(HttpServer, ParallelGreedyStreamsEqualAlone) {
  ServerFixture f;
  std::vector<std::string> alone;
  for (int i = 0; i < 8; ++i) {
    auto r =
        post(f, "/v1/chat/completions",
             chat_body("prompt " + std::to_string(i), R"("max_tokens":12,"temperature":0,"reasoning_effort":"none")"));
    alone.push_back(ojson::parse(r->body)["choices"][0]["message"]["content"]);
  }
  std::vector<std::string> par(8);
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] {
      auto r = post(f, "/v1/chat/completions",
                    chat_body("prompt " + std::to_string(i),
                              R"("max_tokens":12,"temperature":0,"stream":true,"reasoning_effort":"none")"));
      for (const auto& e : sse_events(r->body)) {
        if (e == "[DONE]") continue;
        auto c = ojson::parse(e);
        if (c["choices"][0]["delta"].contains("content"))
          par[static_cast<size_t>(i)] += c["choices"][0]["delta"]["content"].get<std::string>();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(par, alone);
}

TEST(HttpServer, ShutdownDrains) {
  ServerFixture f;
  f.engine.delay_ms = 2;
  std::thread t([&] {
    auto r = post(f, "/v1/chat/completions", chat_body("x", R"("max_tokens":30)"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);  // in-flight request finishes
  });
  // Shut down once the request runs (a fixed sleep raced a loaded machine: the request arrived after the drain).
  for (int i = 0; i < 500 && metric(f, "num_requests_running") < 1; ++i) std::this_thread::sleep_for(10ms);
  int64_t aborted = -1;
  std::thread s([&] { aborted = f.http->shutdown(5.0); });
  t.join();
  s.join();
  EXPECT_EQ(aborted, 0);                    // it finished in time
  EXPECT_FALSE(f.client().Get("/health"));  // no longer listening
}

// A second signal during the drain (HttpServer::abort_drain): the wait ends at once, the running and queued requests
// are aborted and counted, the running stream gets its draining event, and its access line counts its tokens.
TEST(HttpServer, AbortDrainEndsTheWaitAtOnce) {
  SchedulerOptions so;
  so.max_num_seqs = 1;
  ServerFixture f({}, so);
  f.engine.delay_ms = 5;  // 200 tokens: ~1 s per request, 3 requests in a row
  RawConn a(f.port, "/v1/chat/completions", chat_body("long", R"("max_tokens":200,"stream":true)").dump());
  EXPECT_NE(a.read_some().find("200"), std::string::npos);
  RawConn b(f.port, "/v1/chat/completions", chat_body("long", R"("max_tokens":200)").dump());
  RawConn c(f.port, "/v1/chat/completions", chat_body("long", R"("max_tokens":200)").dump());
  for (int i = 0; i < 500 && metric(f, "num_requests_waiting") < 2; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(metric(f, "num_requests_waiting"), 2);
  ::testing::internal::CaptureStderr();
  std::atomic<bool> returned{false};
  int64_t aborted = -1;
  std::thread s([&] {
    aborted = f.http->shutdown(600.0);
    returned = true;
  });
  for (int i = 0; i < 20; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(returned.load());  // draining: it would wait up to 600 s
  f.http->abort_drain();
  s.join();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(aborted, 3);
  EXPECT_NE(log.find("draining ended early by a second signal: 3 request(s) aborted"), std::string::npos) << log;
  // The server stopped its io threads; the socket stays open until it is destroyed: read what was written.
  timeval tv{1, 0};
  setsockopt(a.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string rest, chunk;
  while (rest.find("[DONE]") == std::string::npos && !(chunk = a.read_some()).empty()) rest += chunk;
  EXPECT_NE(rest.find("\"code\":\"draining\""), std::string::npos) << rest;
  const size_t at = log.find("finish_reason=abort:draining");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find("completion_tokens=-1"), std::string::npos) << log;
}

// The old front end tied one thread to each connection: with its pool busy on streams, /health hung.
TEST(HttpServer, HealthAnswersWhileHundredsOfStreamsAreOpen) {
  SchedulerOptions so;
  so.max_num_seqs = 4;
  so.max_queue_len = 1024;
  ServerFixture f({}, so);
  f.engine.delay_ms = 5;
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < 300; ++i)
    conns.push_back(std::make_unique<RawConn>(f.port, "/v1/chat/completions",
                                              chat_body("s", R"("max_tokens":50,"stream":true)").dump()));
  for (int i = 0; i < 300 && metric(f, "num_requests_waiting") < 100; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(metric(f, "num_requests_waiting"), 100);
  auto r = f.client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_GE(metric(f, "num_requests_waiting") + metric(f, "num_requests_running"), 1);
  EXPECT_GE(f.http->open_connections(), 300);
  conns.clear();  // every client goes away: every sequence is freed
  for (int i = 0; i < 500 && (metric(f, "num_requests_running") != 0 || metric(f, "num_requests_waiting") != 0); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(metric(f, "num_requests_running"), 0);
  EXPECT_EQ(metric(f, "num_requests_waiting"), 0);
  EXPECT_EQ(metric(f, "kv_cache_blocks_used"), 0);
}

// curl -d sends a form content type: the body is JSON all the same (the old front end gave a false 413 above 8 KB).
TEST(HttpServer, FormContentTypeWithJsonBody) {
  ServerFixture f;
  const std::string body = chat_body(std::string(9000, 'x'), R"("max_tokens":2)").dump();
  auto r = f.client().Post("/v1/chat/completions", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_NE(r->status, 413) << r->body;
  expect_error(r, 400, "context_length_exceeded");  // 9000 bytes of prompt do not fit the 256-token fake context
  r = f.client().Post("/v1/chat/completions", chat_body("hi", R"("max_tokens":2)").dump(),
                      "application/x-www-form-urlencoded");
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, NumberOverflowIsInvalidJson) {
  ServerFixture f;
  auto c = f.client();
  for (const char* b : {R"({"messages":[{"role":"user","content":"x"}],"metadata":{"a":1e400}})",
                        R"({"messages":[{"role":"user","content":"x"}],"temperature":-1e400})"}) {
    auto r = c.Post("/v1/chat/completions", b, "application/json");
    expect_error(r, 400, "invalid_json");
    EXPECT_NE(ojson::parse(r->body)["error"]["message"].get<std::string>().find("byte"), std::string::npos) << r->body;
  }
}

// Keep-alive is not limited to a few requests per connection; pipelined requests are answered in order.
TEST(HttpServer, KeepAliveServesManyRequestsOnOneConnection) {
  ServerFixture f;
  const int fd = latent::testing::connect_local(f.port, 10);
  ASSERT_GE(fd, 0);
  std::string all;
  const std::string one = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 30; ++i) {
    ASSERT_EQ(::send(fd, one.data(), one.size(), MSG_NOSIGNAL), static_cast<ssize_t>(one.size()));
    std::string got;
    char buf[4096];
    while (got.find("{\"status\":\"ok\"}") == std::string::npos) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << "connection closed after " << i << " requests";
      got.append(buf, static_cast<size_t>(n));
    }
    EXPECT_EQ(got.find("Connection: close"), std::string::npos);
  }
  const std::string two = one + one;
  ASSERT_EQ(::send(fd, two.data(), two.size(), MSG_NOSIGNAL), static_cast<ssize_t>(two.size()));
  std::string got;
  char buf[4096];
  while (got.find("{\"status\":\"ok\"}", got.find("{\"status\":\"ok\"}") + 1) == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
}

// A chunked body over the limit is refused while it is read; every 413 is counted.
TEST(HttpServer, ChunkedBodyOverTheLimitIs413AndCounted) {
  HttpOptions ho;
  ho.max_request_bytes = 1000;
  ServerFixture f(ho);
  std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) req += "200\r\n" + std::string(0x200, 'x') + "\r\n";
  req += "0\r\n\r\n";
  expect_error(f.client().raw(req), 413, "request_too_large");
  expect_error(post(f, "/v1/chat/completions", chat_body(std::string(2000, 'x'))), 413, "request_too_large");
  EXPECT_NE(f.client()
                .Get("/metrics")
                ->body.find("requests_rejected_total{model_name=\"fake-model\",reason=\"too_large\"} 2"),
            std::string::npos);
}

// A stream whose reader stops reading is dropped after the write timeout and its sequence freed; the scheduler and
// the other clients are not held up meanwhile.
TEST(HttpServer, StalledReaderIsDroppedAndItsSequenceFreed) {
  HttpOptions ho;
  ho.write_timeout_s = 0.3;
  ho.socket_send_buffer = 4096;  // small kernel buffers on both sides: the stream's bytes cannot all fit
  ServerFixture f(ho);
  f.engine.delay_ms = 10;  // 200 steps: ~2 s of generation, far longer than the write timeout
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 2048;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(f.port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string body =
      chat_body("long", R"("max_tokens":200,"n":16,"stream":true,"logprobs":true,"top_logprobs":20)").dump();
  const std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
      body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  // Never read. Meanwhile another client is served normally.
  auto r = post(f, "/v1/chat/completions", chat_body("hi", R"("max_tokens":3)"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // The stalled stream is cut and its request cancelled (counted as a client disconnect), well before it could end.
  const std::string aborted = "requests_aborted_total{model_name=\"fake-model\",reason=\"client_disconnect\"} 1";
  for (int i = 0; i < 300 && f.client().Get("/metrics")->body.find(aborted) == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_NE(f.client().Get("/metrics")->body.find(aborted), std::string::npos);
  for (int i = 0; i < 100 && (metric(f, "num_requests_running") != 0 || metric(f, "kv_cache_blocks_used") != 0); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(metric(f, "num_requests_running"), 0);
  EXPECT_EQ(metric(f, "kv_cache_blocks_used"), 0);
  std::string got;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
  EXPECT_EQ(got.find("[DONE]"), std::string::npos);  // it was cut short
  ::close(fd);
}

// The repetition-loop warning: at most once per request, and never for ignore_eos (benchmarks run past EOS).
TEST(HttpServer, LoopWarningOncePerRequestAndNotForIgnoreEos) {
  ServerFixture f;
  std::string text;
  for (int i = 0; i < 60; ++i) text += "ab";
  f.engine.set_script("loop", script(text));
  ::testing::internal::CaptureStderr();
  auto r = post(f, "/v1/chat/completions", chat_body("[[loop]]", R"("max_tokens":100,"n":3,"temperature":0)"));
  const std::string log1 = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(r->status, 200) << r->body;
  size_t n = 0;
  for (size_t p = log1.find("repetition loop"); p != std::string::npos; p = log1.find("repetition loop", p + 1)) ++n;
  EXPECT_EQ(n, 1u) << log1;
  // Without --stop-on-loop a detection is news, not a problem: info, and it says the choice goes on.
  EXPECT_NE(log1.find("[latent info] sequence "), std::string::npos) << log1;
  EXPECT_NE(log1.find("repetition loop detected (period 2, "), std::string::npos) << log1;
  EXPECT_NE(log1.find("it keeps generating (--stop-on-loop would end it)"), std::string::npos) << log1;
  EXPECT_EQ(log1.find("[latent warn]"), std::string::npos) << log1;
  EXPECT_EQ(ojson::parse(r->body)["choices"][0]["finish_reason"], "length");  // it ran to max_tokens
  ::testing::internal::CaptureStderr();
  r = post(f, "/v1/chat/completions", chat_body("[[loop]]", R"("max_tokens":100,"n":2,"ignore_eos":true)"));
  const std::string log2 = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(log2.find("repetition loop"), std::string::npos) << log2;
  EXPECT_GE(metric(f, "repetition_loops_total"), 3);  // every looping sequence is still counted
  EXPECT_NE(f.client()
                .Get("/metrics")
                ->body.find(
                    "# HELP latent:repetition_loops_total Sequences in which a repetition loop was detected (they keep "
                    "generating unless --stop-on-loop ends them)."),
            std::string::npos);
}

// With --stop-on-loop the detection ends the choice: that cuts output, so it is a warning that says so.
TEST(HttpServer, StopOnLoopEndsTheChoiceAndWarns) {
  SchedulerOptions so;
  so.stop_on_loop = true;
  ServerFixture f({}, so);
  std::string text;
  for (int i = 0; i < 60; ++i) text += "ab";
  f.engine.set_script("loop", script(text));
  ::testing::internal::CaptureStderr();
  auto r = post(f, "/v1/chat/completions", chat_body("[[loop]]", R"("max_tokens":100,"temperature":0)"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(r->status, 200) << r->body;
  const auto j = ojson::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 100);  // stopped early
  EXPECT_NE(log.find("[latent warn] sequence "), std::string::npos) << log;
  EXPECT_NE(log.find("repetition loop detected (period 2, "), std::string::npos) << log;
  EXPECT_NE(log.find("stopped (--stop-on-loop), finish_reason length"), std::string::npos) << log;
  EXPECT_EQ(metric(f, "repetition_loops_total"), 1);
}

}  // namespace
}  // namespace latent::server
