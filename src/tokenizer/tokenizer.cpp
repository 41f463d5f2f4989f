#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace latent {

struct Tokenizer::Impl {
  std::string source;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  std::vector<AddedToken> added;  // never resized after load (pointers into it are kept)
  // Text of each added token for id_to_token / decode: HF gives a normalized token its normalized content.
  std::vector<std::string> added_text;
  AddedTokenMatcher raw_matcher, norm_matcher;
  std::vector<TokenId> prefix, suffix;  // post-processor, single sequence
  TokenizerConfig config;

  std::vector<const std::string*> token_by_id;  // added first, then vocab; nullptr: no token
  std::vector<uint8_t> is_special;              // token string is a special added token's content
  std::vector<uint8_t> is_added;
  std::unordered_map<std::string, TokenId> added_by_content;
  std::vector<std::string> token_bytes;  // ByteLevel decoder only
  size_t vocab_size = 0;
};

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot open {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read {}", p.string());
  return ss.str();
}

nlohmann::json parse_json(std::string_view text, const std::string& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", file, e.what());
  }
}

// A special-token field of tokenizer_config.json: a string, an AddedToken object with "content", or null.
std::string token_string(const nlohmann::json& cfg, const char* key, const std::string& file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("{}: \"{}\" must be a string or an object with a \"content\" string", file, key);
}

TokenizerConfig parse_config(const nlohmann::json& cfg, const std::string& file) {
  TokenizerConfig c;
  if (!cfg.is_object()) fail("{}: not a JSON object", file);
  c.tokenizer_class = json_opt_string(cfg, "tokenizer_class", "tokenizer_config", file);
  c.bos_token = token_string(cfg, "bos_token", file);
  c.eos_token = token_string(cfg, "eos_token", file);
  c.pad_token = token_string(cfg, "pad_token", file);
  c.unk_token = token_string(cfg, "unk_token", file);
  for (auto [key, dst] : {std::pair{"add_bos_token", &c.add_bos_token}, std::pair{"add_eos_token", &c.add_eos_token}}) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) continue;
    if (!it->is_boolean()) fail("{}: \"{}\" is not a boolean", file, key);
    *dst = it->get<bool>();
  }
  c.clean_up_tokenization_spaces = json_bool(cfg, "clean_up_tokenization_spaces", false, "tokenizer_config", file);
  if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
            !e["template"].is_string())
          fail("{}: \"chat_template\" list entries must be {{\"name\": ..., \"template\": ...}}", file);
        if (e["name"] == "default") c.chat_template = e["template"].get<std::string>();
      }
    } else {
      fail("{}: \"chat_template\" must be a string or a list of {{name, template}}", file);
    }
  }
  return c;
}

// Post-processor for a single sequence: ids before and after it.
void parse_post_processor(const nlohmann::json& j, const std::string& file, std::vector<TokenId>& prefix,
                          std::vector<TokenId>& suffix) {
  if (j.is_null()) return;
  const std::string type = json_type_field(j, "post_processor", file);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const auto& arr = json_field(j, "processors", "post_processor Sequence", file);
    if (!arr.is_array()) fail("{}: post_processor Sequence: \"processors\" is not an array", file);
    for (const auto& p : arr) {
      std::vector<TokenId> pre, suf;
      parse_post_processor(p, file, pre, suf);
      prefix.insert(prefix.begin(), pre.begin(), pre.end());
      suffix.insert(suffix.end(), suf.begin(), suf.end());
    }
    return;
  }
  if (type == "TemplateProcessing") {
    const auto& single = json_field(j, "single", "post_processor TemplateProcessing", file);
    const auto& specials = json_field(j, "special_tokens", "post_processor TemplateProcessing", file);
    if (!single.is_array()) fail("{}: TemplateProcessing: \"single\" is not an array", file);
    if (!specials.is_object()) fail("{}: TemplateProcessing: \"special_tokens\" is not an object", file);
    bool seen_a = false;
    for (const auto& item : single) {
      if (item.is_object() && item.contains("SpecialToken")) {
        const auto& st = item["SpecialToken"];
        const std::string name = json_string(st, "id", "TemplateProcessing SpecialToken", file);
        auto it = specials.find(name);
        if (it == specials.end())
          fail("{}: TemplateProcessing: special token {:?} is missing from \"special_tokens\"", file, name);
        const auto& ids = json_field(*it, "ids", "TemplateProcessing special_tokens entry", file);
        if (!ids.is_array()) fail("{}: TemplateProcessing: special_tokens[{:?}].ids is not an array", file, name);
        for (const auto& id : ids) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
            fail("{}: TemplateProcessing: special_tokens[{:?}].ids holds a non-id {}", file, name, id.dump());
          (seen_a ? suffix : prefix).push_back(static_cast<TokenId>(id.get<int64_t>()));
        }
      } else if (item.is_object() && item.contains("Sequence")) {
        const std::string seq = json_string(item["Sequence"], "id", "TemplateProcessing Sequence", file);
        if (seq != "A" || seen_a) fail("{}: TemplateProcessing: \"single\" must hold sequence $A exactly once", file);
        seen_a = true;
      } else {
        fail("{}: TemplateProcessing: bad \"single\" item {}", file, item.dump());
      }
    }
    if (!seen_a) fail("{}: TemplateProcessing: \"single\" has no $A", file);
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto pair_id = [&](const char* key) {
      const auto& v = json_field(j, key, type.c_str(), file);
      if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer() || v[1].get<int64_t>() < 0)
        fail("{}: {}: \"{}\" must be [token, id]", file, type, key);
      return static_cast<TokenId>(v[1].get<int64_t>());
    };
    prefix.push_back(pair_id("cls"));
    suffix.push_back(pair_id("sep"));
    return;
  }
  fail("{}: unknown post_processor type '{}'", file, type);
}

bool is_llama_class(const std::string& cls) {
  return cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast" || cls == "CodeLlamaTokenizer" ||
         cls == "CodeLlamaTokenizerFast";
}

std::shared_ptr<Tokenizer::Impl> build(const nlohmann::json& j, const std::string& file, const nlohmann::json* cfg,
                                       const std::string& cfg_file, const std::string& chat_template_file) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->source = file;
  try {
    if (!j.is_object()) fail("{}: not a JSON object", file);

    // Model.
    const auto& model = json_field(j, "model", "tokenizer.json", file);
    std::string mtype = model.is_object() && model.contains("type") && model["type"].is_string()
                            ? model["type"].get<std::string>()
                            : std::string();
    if (mtype.empty() && model.is_object() && model.contains("merges")) mtype = "BPE";
    if (mtype != "BPE") fail("{}: model type '{}' is not supported (only BPE)", file, mtype);
    impl->model = BpeModel::from_json(model, file);

    impl->normalizer = make_normalizer(j.value("normalizer", nlohmann::json()), file);
    impl->pre_tokenizer = PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()), file);
    if (impl->pre_tokenizer.byte_level()) impl->model->enable_byte_level();
    impl->decoder = Decoder::from_json(j.value("decoder", nlohmann::json()), file);
    parse_post_processor(j.value("post_processor", nlohmann::json()), file, impl->prefix, impl->suffix);

    // Added tokens.
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      const auto& arr = j["added_tokens"];
      if (!arr.is_array()) fail("{}: \"added_tokens\" is not an array", file);
      std::unordered_set<TokenId> ids;
      for (size_t i = 0; i < arr.size(); ++i) {
        const auto& t = arr[i];
        AddedToken a;
        const std::string what = fmt::format("added_tokens[{}]", i);
        const auto& id = json_field(t, "id", what.c_str(), file);
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
          fail("{}: {}.id is not a token id: {}", file, what, id.dump());
        a.id = static_cast<TokenId>(id.get<int64_t>());
        a.content = json_string(t, "content", what.c_str(), file);
        if (!unicode::is_valid_utf8(a.content)) fail("{}: {}.content is not valid UTF-8", file, what);
        a.special = json_bool(t, "special", false, what.c_str(), file);
        a.lstrip = json_bool(t, "lstrip", false, what.c_str(), file);
        a.rstrip = json_bool(t, "rstrip", false, what.c_str(), file);
        a.single_word = json_bool(t, "single_word", false, what.c_str(), file);
        a.normalized = json_bool(t, "normalized", !a.special, what.c_str(), file);
        if (a.content.empty()) continue;  // HF ignores empty contents
        if (a.id > impl->model->max_id() + static_cast<TokenId>(arr.size()) + 65536)
          fail("{}: {}.id {} is far past the vocab (max id {})", file, what, a.id, impl->model->max_id());
        if (!ids.insert(a.id).second) fail("{}: {}: id {} is used by two added tokens", file, what, a.id);
        if (auto vid = impl->model->token_to_id(a.content); vid && *vid != a.id)
          fail("{}: {}: {:?} has id {} but the vocab gives it id {}", file, what, a.content, a.id, *vid);
        if (impl->added_by_content.count(a.content)) fail("{}: {}: {:?} is listed twice", file, what, a.content);
        impl->added_by_content[a.content] = a.id;
        impl->added.push_back(std::move(a));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", file, e.what());
  }

  // Matchers: specials first, then the others (HF order; matters only for equal patterns).
  {
    std::vector<std::string> raw_p, norm_p;
    std::vector<const AddedToken*> raw_t, norm_t;
    for (int pass = 0; pass < 2; ++pass)
      for (const auto& a : impl->added) {
        if (a.special != (pass == 0)) continue;
        if (a.normalized) {
          norm_p.push_back(a.content);
          if (impl->normalizer) impl->normalizer->normalize(norm_p.back());
          norm_t.push_back(&a);
        } else {
          raw_p.push_back(a.content);
          raw_t.push_back(&a);
        }
      }
    impl->raw_matcher.build(raw_p, raw_t);
    impl->norm_matcher.build(norm_p, norm_t);
  }

  // Id tables.
  size_t limit = static_cast<size_t>(impl->model->max_id() + 1);
  for (const auto& a : impl->added) limit = std::max(limit, static_cast<size_t>(a.id) + 1);
  impl->token_by_id.assign(limit, nullptr);
  impl->is_special.assign(limit, 0);
  impl->is_added.assign(limit, 0);
  for (size_t id = 0; id < static_cast<size_t>(impl->model->max_id() + 1); ++id)
    impl->token_by_id[id] = impl->model->id_to_token(static_cast<TokenId>(id));
  std::unordered_set<std::string_view> special_contents;
  impl->added_text.reserve(impl->added.size());
  for (const auto& a : impl->added) {
    impl->added_text.push_back(a.content);
    if (a.normalized && impl->normalizer) impl->normalizer->normalize(impl->added_text.back());
  }
  for (size_t k = 0; k < impl->added.size(); ++k) {
    const AddedToken& a = impl->added[k];
    impl->token_by_id[static_cast<size_t>(a.id)] = &impl->added_text[k];
    impl->is_added[static_cast<size_t>(a.id)] = 1;
    if (a.special) special_contents.insert(a.content);
  }
  for (size_t id = 0; id < limit; ++id) {
    if (!impl->token_by_id[id]) continue;
    ++impl->vocab_size;
    if (special_contents.count(*impl->token_by_id[id])) impl->is_special[id] = 1;
  }
  if (impl->decoder.pure_byte_level()) {
    impl->token_bytes.resize(limit);
    for (size_t id = 0; id < limit; ++id) {
      const std::string* t = impl->token_by_id[id];
      if (!t) continue;
      auto raw = byte_level::decode(*t);
      impl->token_bytes[id] = raw ? std::move(*raw) : *t;
    }
  }

  // tokenizer_config.json and chat_template.jinja.
  if (cfg) impl->config = parse_config(*cfg, cfg_file);
  if (!chat_template_file.empty()) impl->config.chat_template = read_file(chat_template_file);

  // transformers' Llama tokenizers rebuild the post-processor from add_bos_token (default true) and
  // add_eos_token (default false) (LlamaTokenizerFast.update_post_processor); DeepSeek declares this class.
  const TokenizerConfig& c = impl->config;
  if (is_llama_class(c.tokenizer_class)) {
    impl->prefix.clear();
    impl->suffix.clear();
    auto id_of = [&](const std::string& s, const char* what) {
      auto it = impl->added_by_content.find(s);
      if (it != impl->added_by_content.end()) return it->second;
      if (auto v = impl->model->token_to_id(s)) return *v;
      fail("{}: {} {:?} is not a token of {}", cfg_file, what, s, file);
    };
    if (c.add_bos_token.value_or(true)) {
      if (c.bos_token.empty()) fail("{}: add_bos_token is true but there is no bos_token", cfg_file);
      impl->prefix.push_back(id_of(c.bos_token, "bos_token"));
    }
    if (c.add_eos_token.value_or(false)) {
      if (c.eos_token.empty()) fail("{}: add_eos_token is true but there is no eos_token", cfg_file);
      impl->suffix.push_back(id_of(c.eos_token, "eos_token"));
    }
  }
  for (TokenId id : impl->prefix)
    if (static_cast<size_t>(id) >= limit || !impl->token_by_id[static_cast<size_t>(id)])
      fail("{}: the post-processor adds id {}, which has no token", file, id);
  for (TokenId id : impl->suffix)
    if (static_cast<size_t>(id) >= limit || !impl->token_by_id[static_cast<size_t>(id)])
      fail("{}: the post-processor adds id {}, which has no token", file, id);
  return impl;
}

struct EncodeScratch {
  std::vector<AddedTokenMatcher::Segment> segs1, segs2;
  std::vector<std::string_view> pieces;
  PreTokScratch pre;
  std::string norm;
  // A thread keeps at most ~1 MiB per buffer between calls: one huge text must not pin its memory for good (a
  // server's worker threads tokenize whatever arrives).
  template <class V>
  static void shrink(V& v) {
    if (v.capacity() * sizeof(v[0]) > (size_t{1} << 20)) V().swap(v);
  }
  void release_large() {
    shrink(segs1), shrink(segs2), shrink(pieces), shrink(pre.a), shrink(pre.b), shrink(pre.matches), shrink(pre.parts);
    shrink(norm);
  }
};

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  fs::path dir;
  if (fs::is_directory(p, ec)) {
    dir = p;
    p = p / "tokenizer.json";
  } else {
    dir = p.parent_path();
  }
  if (!fs::exists(p, ec)) fail("no tokenizer.json at {}", p.string());
  const nlohmann::json j = parse_json(read_file(p), p.string());
  const fs::path cfg = dir / "tokenizer_config.json";
  nlohmann::json cfg_json;
  const bool have_cfg = fs::exists(cfg, ec);
  if (have_cfg) cfg_json = parse_json(read_file(cfg), cfg.string());
  const fs::path tmpl = dir / "chat_template.jinja";
  return Tokenizer(
      build(j, p.string(), have_cfg ? &cfg_json : nullptr, cfg.string(), fs::exists(tmpl, ec) ? tmpl.string() : ""));
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, const std::string& name, std::string_view config_json) {
  const nlohmann::json j = parse_json(tokenizer_json, name);
  const std::string cfg_name = name + " (tokenizer_config)";
  nlohmann::json cfg;
  if (!config_json.empty()) cfg = parse_json(config_json, cfg_name);
  return Tokenizer(build(j, name, config_json.empty() ? nullptr : &cfg, cfg_name, ""));
}

Tokenizer Tokenizer::from_parsed(const nlohmann::json& tokenizer_json, const std::string& name,
                                 const nlohmann::json* config_json) {
  return Tokenizer(build(tokenizer_json, name, config_json, name + " (tokenizer_config)", ""));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  EncodeOptions o;
  o.add_special_tokens = add_special_tokens;
  return encode(text, o);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::utf8_lossy(text);
    text = repaired;
  }
  thread_local EncodeScratch s;
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (opts.add_special_tokens) ids.insert(ids.end(), m.prefix.begin(), m.prefix.end());
  const bool byte_level = m.pre_tokenizer.byte_level();

  s.segs1.clear();
  m.raw_matcher.find(text, opts.split_special_tokens, s.segs1);
  for (const auto& seg : s.segs1) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view gap = text.substr(seg.begin, seg.end - seg.begin);
    if (m.normalizer) {
      s.norm.assign(gap);
      m.normalizer->normalize(s.norm);
      gap = s.norm;
    }
    s.segs2.clear();
    m.norm_matcher.find(gap, opts.split_special_tokens, s.segs2);
    for (const auto& seg2 : s.segs2) {
      if (seg2.id >= 0) {
        ids.push_back(seg2.id);
        continue;
      }
      s.pieces.clear();
      s.pre.clear();
      m.pre_tokenizer.run(gap.substr(seg2.begin, seg2.end - seg2.begin), s.pieces, s.pre);
      for (auto piece : s.pieces) m.model->tokenize(piece, byte_level, ids);
    }
  }
  if (opts.add_special_tokens) ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
  s.release_large();
  return ids;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  const size_t limit = m.token_by_id.size();
  if (m.decoder.pure_byte_level()) {
    std::string bytes;
    for (TokenId id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= limit || !m.token_by_id[static_cast<size_t>(id)]) continue;
      if (skip_special_tokens && m.is_special[static_cast<size_t>(id)]) continue;
      bytes += m.token_bytes[static_cast<size_t>(id)];
    }
    return unicode::utf8_lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= limit || !m.token_by_id[static_cast<size_t>(id)]) continue;
    if (skip_special_tokens && m.is_special[static_cast<size_t>(id)]) continue;
    tokens.push_back(*m.token_by_id[static_cast<size_t>(id)]);
  }
  std::string out = m.decoder.decode(std::move(tokens));
  return unicode::is_valid_utf8(out) ? out : unicode::utf8_lossy(out);
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.token_by_id.size() || !m.token_by_id[static_cast<size_t>(id)])
    return std::nullopt;
  return *m.token_by_id[static_cast<size_t>(id)];
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& m = *impl_;
  auto it = m.added_by_content.find(std::string(token));
  if (it != m.added_by_content.end()) return it->second;
  return m.model->token_to_id(token);
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
size_t Tokenizer::id_limit() const { return impl_->token_by_id.size(); }

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_special.size() && impl_->is_special[static_cast<size_t>(id)];
}

bool Tokenizer::is_added(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_added.size() && impl_->is_added[static_cast<size_t>(id)];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

std::optional<TokenId> Tokenizer::bos_id() const {
  return impl_->config.bos_token.empty() ? std::nullopt : token_to_id(impl_->config.bos_token);
}
std::optional<TokenId> Tokenizer::eos_id() const {
  return impl_->config.eos_token.empty() ? std::nullopt : token_to_id(impl_->config.eos_token);
}
std::optional<TokenId> Tokenizer::pad_id() const {
  return impl_->config.pad_token.empty() ? std::nullopt : token_to_id(impl_->config.pad_token);
}

const std::vector<TokenId>& Tokenizer::prefix_ids() const { return impl_->prefix; }
const std::vector<TokenId>& Tokenizer::suffix_ids() const { return impl_->suffix; }

bool Tokenizer::byte_level_decoder() const { return impl_->decoder.pure_byte_level(); }

std::string_view Tokenizer::token_bytes(TokenId id) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.token_bytes.size()) return {};
  return m.token_bytes[static_cast<size_t>(id)];
}

const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace latent
