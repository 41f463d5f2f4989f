#include "server/api_error.h"

#include <fmt/format.h>

namespace latent::server {

nlohmann::ordered_json ApiError::body() const {
  nlohmann::ordered_json e = nlohmann::ordered_json::object();
  e["message"] = message;
  e["type"] = type;
  e["param"] = param ? nlohmann::ordered_json(*param) : nlohmann::ordered_json(nullptr);
  e["code"] = code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code);
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["error"] = std::move(e);
  return j;
}

void bad_request(const std::string& code, const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", code, param.empty() ? std::nullopt : std::optional<std::string>(param),
                 message);
}

void invalid_type(const std::string& param, const std::string& expected) {
  bad_request("invalid_type", param, fmt::format("Invalid type for '{}': expected {}.", param, expected));
}

void invalid_value(const std::string& param, const std::string& message) {
  bad_request("invalid_value", param, message);
}

void missing_param(const std::string& param) {
  bad_request("missing_required_parameter", param, fmt::format("Missing required parameter: '{}'.", param));
}

void unsupported(const std::string& param, const std::string& message) {
  bad_request("unsupported_parameter", param, message);
}

ApiError invalid_json_error(const std::string& detail) {
  return ApiError(400, "invalid_request_error", "invalid_json", std::nullopt,
                  fmt::format("The request body is not a valid JSON object: {}", detail));
}

ApiError auth_error() {
  ApiError e(401, "invalid_request_error", "invalid_api_key", std::nullopt, "Invalid API key.");
  e.headers.emplace_back("WWW-Authenticate", "Bearer");
  return e;
}

ApiError not_found_error(const std::string& message, std::optional<std::string> param) {
  return ApiError(404, "invalid_request_error", "not_found", std::move(param), message);
}

ApiError method_not_allowed_error(const std::string& allow) {
  ApiError e(405, "invalid_request_error", "method_not_allowed", std::nullopt,
             fmt::format("Method not allowed; allowed: {}.", allow));
  e.headers.emplace_back("Allow", allow);
  return e;
}

ApiError too_large_error(size_t limit) {
  return ApiError(413, "invalid_request_error", "request_too_large", std::nullopt,
                  fmt::format("The request body exceeds the limit of {} bytes.", limit));
}

ApiError model_not_found_error(const std::string& model) {
  return ApiError(404, "invalid_request_error", "model_not_found", std::string("model"),
                  fmt::format("The model '{}' does not exist.", model));
}

ApiError overloaded_error(const std::string& message) {
  ApiError e(503, "server_error", "server_is_overloaded", std::nullopt, message);
  e.headers.emplace_back("Retry-After", "1");
  return e;
}

ApiError server_error(int status, const std::string& code, const std::string& message) {
  return ApiError(status, "server_error", code, std::nullopt, message);
}

}  // namespace latent::server
