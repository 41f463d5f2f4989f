// latent render --model DIR --messages FILE.json [--tools FILE.json] [--kwargs JSON] [--no-generation-prompt]
// Prints the prompt the model's chat template renders, byte for byte (no newline added), as the server does it.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "jinja/chat_template.h"

namespace latent::cli {

namespace {

using ojson = nlohmann::ordered_json;

ojson read_json_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open {} file", path, what);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return ojson::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

}  // namespace

void register_render(CLI::App& app) {
  struct Opts {
    std::string model;
    std::string messages;
    std::string tools;
    std::string kwargs;
    bool no_generation_prompt = false;
    bool raw_tool_arguments = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("render", "Render a conversation with the model's chat template and print the prompt");
  cmd->add_option("--model", opts->model, "Model directory (default: the bundled model)");
  cmd->add_option("--messages", opts->messages,
                  "JSON file: an array of OpenAI-style messages, or an object with \"messages\" (and \"tools\")")
      ->required();
  cmd->add_option("--tools", opts->tools, "JSON file: an array of tool definitions");
  cmd->add_option(
      "--kwargs", opts->kwargs,
      "JSON object of template variables, e.g. '{\"enable_thinking\": false}' (absent keys stay undefined)");
  cmd->add_flag("--no-generation-prompt", opts->no_generation_prompt, "Render with add_generation_prompt=false");
  cmd->add_flag("--raw-tool-arguments", opts->raw_tool_arguments,
                "Pass tool-call arguments exactly as given (no JSON string <-> object conversion)");
  cmd->callback([opts]() {
    const std::string dir = resolve_model_dir(opts->model);
    const ChatTemplate tmpl = ChatTemplate::load(dir);

    ojson messages = read_json_file(opts->messages, "messages");
    ojson tools;  // null: no tools
    if (messages.is_object()) {
      if (!messages.contains("messages"))
        fail("{}: expected an array of messages or an object with \"messages\"", opts->messages);
      if (messages.contains("tools")) tools = messages["tools"];
      messages = ojson(messages["messages"]);
    }
    if (!messages.is_array()) fail("{}: \"messages\" must be a JSON array", opts->messages);
    if (!opts->tools.empty()) tools = read_json_file(opts->tools, "tools");
    if (!tools.is_null() && !tools.is_array()) fail("tools must be a JSON array");

    ojson kwargs = ojson::object();
    if (!opts->kwargs.empty()) {
      try {
        kwargs = ojson::parse(opts->kwargs);
      } catch (const nlohmann::json::exception& e) {
        fail("--kwargs: invalid JSON: {}", e.what());
      }
      if (!kwargs.is_object()) fail("--kwargs must be a JSON object");
    }

    ChatRenderOptions ropt;
    ropt.normalize_tool_arguments = !opts->raw_tool_arguments;
    const std::string out = tmpl.render(messages, tools, !opts->no_generation_prompt, kwargs, ropt);
    if (!out.empty() && std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) fail("cannot write to stdout");
    std::fflush(stdout);
  });
}

}  // namespace latent::cli
