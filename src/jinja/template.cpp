#include "jinja/template.h"

#include <nlohmann/json.hpp>

#include "jinja/ast.h"
#include "jinja/parser.h"

namespace latent::jinja {

Template::Template(std::string_view source, std::string name) : prog_(parse_template(source, name)) {}

std::string Template::render(const Value& context, const RenderOptions& opt) const {
  if (!context.is_dict()) throw TemplateError(ErrorKind::Type, "template context must be a dict", prog_->name, 1, 1);
  Interpreter in(*prog_, opt);
  return in.render(context);
}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& opt) const {
  return render(from_json(context), opt);
}

const std::string& Template::name() const { return prog_->name; }

}  // namespace latent::jinja
