// The OpenAI error model (docs/api.md §errors): every non-2xx answer is
// {"error": {"message", "type", "param", "code"}} with a string code. ApiError carries one such answer through the
// validation code to the HTTP layer.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace latent::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string code, std::optional<std::string> param, std::string message)
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        code(std::move(code)),
        param(std::move(param)),
        message(std::move(message)) {}

  int status;
  std::string type;  // invalid_request_error | server_error
  std::string code;  // invalid_json, invalid_type, ...
  std::optional<std::string> param;
  std::string message;
  std::vector<std::pair<std::string, std::string>> headers;  // e.g. Retry-After, WWW-Authenticate, Allow

  nlohmann::ordered_json body() const;
  std::string body_text() const {
    return body().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
};

// 400 invalid_request_error with the given code.
[[noreturn]] void bad_request(const std::string& code, const std::string& param, const std::string& message);
[[noreturn]] void invalid_type(const std::string& param, const std::string& expected);
[[noreturn]] void invalid_value(const std::string& param, const std::string& message);
[[noreturn]] void missing_param(const std::string& param);
[[noreturn]] void unsupported(const std::string& param, const std::string& message);

ApiError invalid_json_error(const std::string& detail);
ApiError auth_error();
ApiError not_found_error(const std::string& message, std::optional<std::string> param = std::nullopt);
ApiError method_not_allowed_error(const std::string& allow);
ApiError too_large_error(size_t limit);
ApiError model_not_found_error(const std::string& model);
ApiError overloaded_error(const std::string& message);
ApiError server_error(int status, const std::string& code, const std::string& message);

}  // namespace latent::server
