// Recursive-descent parser mirroring jinja2's Parser (operator precedence, tuple rules, statement set of
// jinja2 + loopcontrols + transformers' {% generation %}). Unknown filters/tests fail at parse time except inside
// {% if %} / inline-if, where jinja2 defers the error to run time.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "jinja/ast.h"

namespace latent::jinja {

constexpr int kMaxParseDepth = 200;  // nesting of expressions and blocks

// Throws TemplateError (Syntax) with line:col.
std::unique_ptr<Program> parse_template(std::string_view source, const std::string& name);

}  // namespace latent::jinja
