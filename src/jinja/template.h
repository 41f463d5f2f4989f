// latent::jinja::Template — a parsed Jinja template, rendered with jinja2's semantics under the environment
// transformers uses for chat templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
// json.dumps-style tojson, raise_exception, strftime_now). Thread-safe: render() may run concurrently.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>

#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/value.h"

namespace latent::jinja {

struct Program;

class Template {
 public:
  // Parses the source; throws TemplateError (kind Syntax, with line:col) on a syntax error or an unknown
  // filter/test outside {% if %} (jinja2 reports those when it compiles the template).
  explicit Template(std::string_view source, std::string name = "template");

  // context: a dict of top-level variables (a key that is absent stays undefined). Throws TemplateError.
  std::string render(const Value& context, const RenderOptions& opt = {}) const;
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& opt = {}) const;

  const std::string& name() const;

 private:
  std::shared_ptr<const Program> prog_;
};

}  // namespace latent::jinja
