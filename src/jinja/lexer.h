// Jinja lexer with jinja2's rules under transformers' settings: trim_blocks, lstrip_blocks, keep_trailing_newline
// off, `{%-`/`-%}`/`{%+`/`+%}` whitespace control, raw blocks, comments, Python string escapes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace latent::jinja {

enum class Tok : uint8_t {
  Data,        // template text (already whitespace-controlled)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,
  Int,
  Float,
  Op,  // operator; text holds it: + - / // * % ** ~ [ ] ( ) { } == != > >= < <= = . : | , ;
  Eof,
};

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
  int col = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError (Syntax) with the position.
std::vector<Token> tokenize(std::string_view source, const std::string& name, const LexOptions& opt = {});

}  // namespace latent::jinja
