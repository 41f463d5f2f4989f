// GET /v1/models[/{id}], /health, /version, /metrics; POST /tokenize, /detokenize
// (docs/api.md §models, §health, §metrics, §tokenize).
#include "server/http_internal.h"

namespace latent::server {

namespace {

ojson model_card(const Service& svc, const std::string& name) {
  const ModelInfo& i = svc.info();
  ojson c = ojson::object();
  c["id"] = name;
  c["object"] = "model";
  c["created"] = i.created;
  c["owned_by"] = "latent";
  c["max_model_len"] = i.max_model_len;
  ojson meta = i.meta;
  meta["reasoning_parser"] = svc.reasoning_enabled() ? "glm45" : "none";
  meta["tool_parser"] = tool_format_name(svc.tool_format());
  meta["vocab_size"] = i.vocab_size;
  meta["max_n"] = svc.options().max_n;
  c["meta"] = std::move(meta);
  return c;
}

}  // namespace

void handle_models(HttpContext& ctx, HttpRequest&, HttpResponse& res) {
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    ojson data = ojson::array();
    for (const auto& n : svc->info().served_names) data.push_back(model_card(*svc, n));
    send_json(res, ojson{{"object", "list"}, {"data", std::move(data)}});
  });
}

void handle_model(HttpContext& ctx, HttpRequest& req, HttpResponse& res) {
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    const std::string& id = req.path_param;
    for (const auto& n : svc->info().served_names)
      if (n == id) return send_json(res, model_card(*svc, n));
    throw not_found_error("The model '" + id + "' does not exist.", std::string("id"));
  });
}

void handle_health(HttpContext& ctx, HttpRequest&, HttpResponse& res) {
  guarded(ctx, res, [&] {
    ctx.ready_service();
    send_json(res, ojson{{"status", "ok"}});
  });
}

void handle_version(HttpContext& ctx, HttpRequest&, HttpResponse& res) {
  const HttpOptions& o = ctx.opt;
  send_json(res, ojson{{"version", o.version}, {"git_sha", o.git_sha}, {"build_type", o.build_type}, {"cuda", o.cuda}});
}

void handle_metrics(HttpContext& ctx, HttpRequest&, HttpResponse& res) {
  if (!ctx.opt.metrics_enabled) return send_error(res, not_found_error("Metrics are disabled (--no-metrics)."));
  std::string model;
  {
    std::lock_guard lk(ctx.mu);
    if (ctx.service && !ctx.service->info().served_names.empty()) model = ctx.service->info().served_names.front();
  }
  res.status = 200;
  res.set_content(ctx.metrics.render(ctx.opt.metrics_prefix, model), "text/plain; version=0.0.4; charset=utf-8");
}

void handle_tokenize(HttpContext& ctx, HttpRequest& req, HttpResponse& res) {
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    TokenizeRequest r;
    {
      const ojson body = parse_json_body(req.body);
      std::string().swap(req.body);
      r = parse_tokenize_request(body, svc->validation());
    }
    std::vector<int32_t> ids =
        r.prompt ? svc->codec().encode(*r.prompt, r.add_special_tokens) : svc->chat_prompt_ids(r.chat);
    ojson out = ojson::object();
    out["count"] = ids.size();
    out["max_model_len"] = svc->info().max_model_len;
    out["tokens"] = ids;
    if (r.return_token_strs) {
      ojson strs = ojson::array();
      for (int32_t id : ids) strs.push_back(svc->codec().token_str(id));
      out["token_strs"] = std::move(strs);
    }
    send_json(res, out);
  });
}

void handle_detokenize(HttpContext& ctx, HttpRequest& req, HttpResponse& res) {
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    const ojson body = parse_json_body(req.body);
    DetokenizeRequest r = parse_detokenize_request(body, svc->validation());
    send_json(res, ojson{{"prompt", svc->codec().decode(r.tokens, /*skip_special=*/false)}});
  });
}

}  // namespace latent::server
