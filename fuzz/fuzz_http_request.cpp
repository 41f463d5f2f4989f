// libFuzzer target for the request path of the HTTP server, without an engine: raw bytes -> HTTP/1.1 request (Beast's
// parser with the server's header and body limits) -> JSON body -> validated request for the route. Every rejection
// must be a Beast error code or an ApiError with a 4xx status; anything else (crash, sanitizer report, other
// exception, leak) is a bug.
//   seeds: fuzz/corpus/http_request
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/request_schema.h"

namespace {

namespace bhttp = boost::beast::http;
using latent::server::ApiError;

const latent::server::ValidationContext& context() {
  static const latent::server::ValidationContext ctx = [] {
    latent::server::ValidationContext c;
    c.served_names = {"model", "alias"};
    c.vocab_size = 1000;
    c.max_n = 16;
    return c;
  }();
  return ctx;
}

void validate(const std::string& path, std::string_view body) {
  using namespace latent::server;
  const ojson j = parse_json_body(body);
  if (path == "/v1/chat/completions") {
    ChatRequest r = parse_chat_request(j, context());
    (void)chat_template_variables(r);
  } else if (path == "/v1/completions") {
    (void)parse_completion_request(j, context());
  } else if (path == "/tokenize") {
    (void)parse_tokenize_request(j, context());
  } else {
    (void)parse_detokenize_request(j, context());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(64 * 1024);
  parser.body_limit(1u << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t off = 0;
  // Fed in pieces, as a socket would.
  while (off < size && !parser.is_done()) {
    const size_t n = std::min<size_t>(size - off, 1 + (data[off] % 97));
    const size_t used = parser.put(boost::asio::buffer(data + off, n), ec);
    if (ec == bhttp::error::need_more) {
      ec = {};
      if (used == 0 && n == size - off) break;
      off += used == 0 ? 0 : used;
      if (used == 0) {  // the parser wants more than this piece: give it the rest at once
        const size_t all = parser.put(boost::asio::buffer(data + off, size - off), ec);
        if (ec == bhttp::error::need_more) return 0;
        if (ec) return 0;
        off += all;
      }
      continue;
    }
    if (ec) return 0;  // a malformed request: the server answers 400 / 413 / 431
    off += used;
  }
  if (!parser.is_done()) return 0;
  const auto& msg = parser.get();
  const std::string target(msg.target());
  const std::string path = target.substr(0, target.find('?'));
  try {
    validate(path, msg.body());
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();
    if (e.body().at("error").size() != 4) std::abort();
  }
  return 0;
}
