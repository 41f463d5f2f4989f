// latent::jinja::TemplateError: every failure of the Jinja interpreter (syntax, undefined values, type errors,
// sandbox violations, raise_exception, limits). It is a latent::Error, so the CLI and the request handler report
// it like any other input error. The message carries "NAME:LINE:COL: Kind: text".
#pragma once
#include <string>

#include "core/error.h"

namespace latent::jinja {

enum class ErrorKind {
  Syntax,     // TemplateSyntaxError / TemplateAssertionError (parse time)
  Undefined,  // UndefinedError
  Type,       // TypeError, ValueError, ZeroDivisionError, ... (Python-level errors)
  Security,   // SecurityError (sandbox)
  Runtime,    // TemplateRuntimeError (unknown filter at run time, bad namespace assignment, ...)
  Raised,     // raise_exception() called by the template
  Limit,      // step / depth / output limits
};

const char* error_kind_name(ErrorKind k);

class TemplateError : public latent::Error {
 public:
  TemplateError(ErrorKind kind, std::string message)
      : latent::Error(std::string(error_kind_name(kind)) + ": " + message), kind_(kind), message_(std::move(message)) {}
  TemplateError(ErrorKind kind, std::string message, std::string name, int line, int col)
      : latent::Error(format(kind, message, name, line, col)),
        kind_(kind),
        message_(std::move(message)),
        name_(std::move(name)),
        line_(line),
        col_(col) {}

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }  // without position and kind
  const std::string& template_name() const { return name_; }
  int line() const { return line_; }  // 1-based; 0 = unknown
  int col() const { return col_; }    // 1-based, in code points
  bool has_position() const { return line_ > 0; }
  TemplateError at(const std::string& name, int line, int col) const {
    return TemplateError(kind_, message_, name, line, col);
  }

 private:
  static std::string format(ErrorKind kind, const std::string& msg, const std::string& name, int line, int col) {
    return name + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + error_kind_name(kind) + ": " + msg;
  }
  ErrorKind kind_;
  std::string message_;
  std::string name_;
  int line_ = 0;
  int col_ = 0;
};

[[noreturn]] inline void throw_error(ErrorKind kind, std::string message) {
  throw TemplateError(kind, std::move(message));
}

inline const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Syntax: return "TemplateSyntaxError";
    case ErrorKind::Undefined: return "UndefinedError";
    case ErrorKind::Type: return "TypeError";
    case ErrorKind::Security: return "SecurityError";
    case ErrorKind::Runtime: return "TemplateRuntimeError";
    case ErrorKind::Raised: return "TemplateError";
    case ErrorKind::Limit: return "LimitError";
  }
  return "Error";
}

}  // namespace latent::jinja
