// latent tokenize --model DIR [--text T | stdin] [--no-special] [--split-special]: the ids, as a JSON array.
// latent detokenize --model DIR [--ids "1 2 3" | stdin] [--skip-special]: the text, byte for byte (no newline
// added). Both use the model's tokenizer.json exactly as the server does.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace latent::cli {

namespace {

std::string read_stdin() {
  std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad()) fail("cannot read standard input");
  return s;
}

// "1 2 3", "1,2,3", "[1, 2, 3]": integers separated by spaces, commas, newlines; brackets ignored.
std::vector<TokenId> parse_ids(const std::string& s) {
  std::vector<TokenId> ids;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') {
      ++i;
      continue;
    }
    size_t j = i;
    if (s[j] == '-' || s[j] == '+') ++j;
    const size_t digits = j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == digits || (j < s.size() && std::string(" ,\n\r\t[]").find(s[j]) == std::string::npos))
      fail("--ids: {:?} is not a token id", s.substr(i, std::min<size_t>(s.find_first_of(" ,\n\r\t[]", i) - i, 40)));
    long long v = 0;
    try {
      v = std::stoll(s.substr(i, j - i));
    } catch (const std::exception&) {
      fail("--ids: {:?} is out of range", s.substr(i, j - i));
    }
    if (v < 0 || v > INT32_MAX) fail("--ids: {} is not a token id (0 .. 2147483647)", v);
    ids.push_back(static_cast<TokenId>(v));
    i = j;
  }
  return ids;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  struct Opts {
    std::string model, text;
    bool no_special = false, split_special = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize",
                                 "Print the token ids of a text (stdin when --text is absent) as a JSON "
                                 "array");
  cmd->add_option("--model", opts->model, "Hugging Face model directory (default: the bundled demo model)");
  auto* text_opt = cmd->add_option("--text", opts->text, "The text (default: read standard input)");
  cmd->add_flag("--no-special", opts->no_special,
                "Do not add the post-processor's special tokens (BOS); like encode(add_special_tokens=False)");
  cmd->add_flag("--split-special", opts->split_special,
                "Tokenize special-token strings as plain text (transformers split_special_tokens)");
  cmd->callback([opts, text_opt]() {
    const Tokenizer tok = Tokenizer::from_file(resolve_model_dir(opts->model));
    const std::string text = text_opt->count() ? opts->text : read_stdin();
    EncodeOptions eo;
    eo.add_special_tokens = !opts->no_special;
    eo.split_special_tokens = opts->split_special;
    const std::vector<TokenId> ids = tok.encode(text, eo);
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

void register_detokenize(CLI::App& app) {
  struct Opts {
    std::string model, ids;
    bool skip_special = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("detokenize",
                                 "Print the text of token ids (--ids, or standard input), byte for "
                                 "byte");
  cmd->add_option("--model", opts->model, "Hugging Face model directory (default: the bundled demo model)");
  auto* ids_opt = cmd->add_option("--ids", opts->ids, "Token ids separated by spaces or commas (default: stdin)");
  cmd->add_flag("--skip-special", opts->skip_special, "Leave out special tokens (skip_special_tokens=True)");
  cmd->callback([opts, ids_opt]() {
    const Tokenizer tok = Tokenizer::from_file(resolve_model_dir(opts->model));
    const std::vector<TokenId> ids = parse_ids(ids_opt->count() ? opts->ids : read_stdin());
    const std::string text = tok.decode(ids, opts->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
  });
}

}  // namespace latent::cli
