// Grammar compilers and the token-mask matcher against scalar references: std::regex for regexes, a JSON parse +
// a small JSON Schema validator for schemas, a recursive checker for a recursive GBNF grammar, and brute force
// ("do the token's bytes keep the prefix viable?") for every mask.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <regex>

#include "structured/compilers.h"
#include "structured/constraint.h"
#include "structured/matcher.h"

namespace latent::structured {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const TokenVocab> byte_vocab() {
  // Every single byte as its own token, plus id 256 as the stop id.
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  v.push_back("");
  return std::make_shared<TokenVocab>(v, std::vector<int32_t>{256});
}

std::shared_ptr<const CompiledGrammar> bind_vocab(std::shared_ptr<const Grammar> g,
                                                  std::shared_ptr<const TokenVocab> v) {
  auto c = std::make_shared<CompiledGrammar>();
  c->grammar = std::move(g);
  c->vocab = std::move(v);
  return c;
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& c, const std::string& s) {
  Matcher m(c);
  return m.accept_bytes(s) && m.can_end();
}

std::string random_string(std::mt19937& rng, const std::string& alphabet, size_t max_len) {
  std::uniform_int_distribution<size_t> len(0, max_len), pick(0, alphabet.size() - 1);
  std::string s;
  for (size_t n = len(rng); n > 0; --n) s += alphabet[pick(rng)];
  return s;
}

// ------------------------------------------------------------------------------------------------ regex

TEST(Regex, AcceptsExactlyWhatStdRegexMatches) {
  const std::vector<std::string> patterns = {"[a-c]+x?",     "(ab|cd)*e",  "a{2,4}b", "\\d{3}-\\d{2}",   "[^a]b*",
                                             "(a|b)?c{0,2}", ".\\.",       "x(y|z)+", "[a-c]{1,3}(d|e)", "^(?:a|bc)+$",
                                             "[\\da-b]{2}",  "\\w\\s?\\W", "a|b|",    "(a*)*b",          "[.-]x{3,}"};
  const std::string alphabet = "abcdexyz019-. _";
  std::mt19937 rng(7);
  for (const auto& p : patterns) {
    auto c = bind_vocab(regex_grammar(p), byte_vocab());
    const std::regex re(p, std::regex::ECMAScript);
    for (int i = 0; i < 3000; ++i) {
      const std::string s = random_string(rng, alphabet, 7);
      const bool want = std::regex_match(s, re);
      ASSERT_EQ(accepts(c, s), want) << "pattern " << p << " string '" << s << "'";
    }
    // Strings built from the pattern's own literal characters, so that matches are common too.
    std::string lits;
    for (char ch : p)
      if (alphabet.find(ch) != std::string::npos) lits += ch;
    for (int i = 0; i < 2000 && !lits.empty(); ++i) {
      const std::string s = random_string(rng, lits, 6);
      ASSERT_EQ(accepts(c, s), std::regex_match(s, re)) << "pattern " << p << " string '" << s << "'";
    }
  }
}

TEST(Regex, CodePointsAreWholeUtf8Sequences) {
  auto c = bind_vocab(regex_grammar(".[é-ü]"), byte_vocab());
  EXPECT_TRUE(accepts(c, "aé"));
  EXPECT_TRUE(accepts(c, "日ü"));
  EXPECT_TRUE(accepts(c, "😀ö"));
  EXPECT_FALSE(accepts(c, "ae"));
  EXPECT_FALSE(accepts(c, "\n\xc3\xa9"));
  EXPECT_FALSE(accepts(c, "a\xc3"));                 // truncated sequence
  EXPECT_FALSE(accepts(c, "\xed\xa0\x80\xc3\xa9"));  // a surrogate is not a code point
}

TEST(Regex, RejectsWhatItCannotRun) {
  for (const char* p : {"(?=a)b", "(a)\\1", "\\bword", "a(?!b)", "(", "a)", "[b-a]", "*a", "a{3,2}"})
    EXPECT_THROW(regex_grammar(p), GrammarError) << p;
}

TEST(Choice, OneOfTheStrings) {
  auto c = bind_vocab(choice_grammar({"yes", "no", "maybe", "y"}), byte_vocab());
  for (const char* s : {"yes", "no", "maybe", "y"}) EXPECT_TRUE(accepts(c, s)) << s;
  for (const char* s : {"", "ye", "yess", "No", "maybe "}) EXPECT_FALSE(accepts(c, s)) << s;
  EXPECT_THROW(choice_grammar({}), GrammarError);
}

// ------------------------------------------------------------------------------------------------ GBNF

bool balanced(const std::string& s) {
  int d = 0;
  for (char c : s) {
    if (c == '(')
      ++d;
    else if (c == ')' && --d < 0)
      return false;
    else if (c != '(' && c != ')')
      return false;
  }
  return d == 0;
}

TEST(Gbnf, RecursiveGrammarMatchesReference) {
  auto c = bind_vocab(gbnf_grammar("# balanced parentheses\nroot ::= (\"(\" root \")\")*\n"), byte_vocab());
  std::mt19937 rng(3);
  for (int i = 0; i < 4000; ++i) {
    const std::string s = random_string(rng, "()", 10);
    ASSERT_EQ(accepts(c, s), balanced(s)) << s;
  }
}

TEST(Gbnf, SyntaxMatchesRegexEquivalent) {
  auto c = bind_vocab(gbnf_grammar("root ::= item (\",\" item){0,2} tail?\nitem ::= [a-c]+ | \"x\" [0-9]\n"
                                   "tail ::= \"!\"\n  | \"?\"   # comment\n"),
                      byte_vocab());
  const std::regex re("([a-c]+|x[0-9])(,([a-c]+|x[0-9])){0,2}(!|\\?)?");
  std::mt19937 rng(5);
  for (int i = 0; i < 5000; ++i) {
    const std::string s = random_string(rng, "abcx19,!?", 8);
    ASSERT_EQ(accepts(c, s), std::regex_match(s, re)) << s;
  }
  auto esc = bind_vocab(gbnf_grammar("root ::= \"\\x41\\n\" [^\\n]"), byte_vocab());
  EXPECT_TRUE(accepts(esc, "A\nz"));
  EXPECT_FALSE(accepts(esc, "A\n\n"));
}

TEST(Gbnf, Errors) {
  EXPECT_THROW(gbnf_grammar("root ::= root \"a\" | \"b\""), GrammarError);  // left recursion
  EXPECT_THROW(gbnf_grammar("root ::= x"), GrammarError);                   // undefined rule
  EXPECT_THROW(gbnf_grammar("start ::= \"a\""), GrammarError);              // no root
  EXPECT_THROW(gbnf_grammar("root ::= \"a"), GrammarError);                 // unterminated literal
  EXPECT_THROW(gbnf_grammar("root ::= [b-a]"), GrammarError);
  EXPECT_THROW(gbnf_grammar("root ::= a\na ::= a"), GrammarError);  // matches nothing
  try {
    gbnf_grammar("root ::= \"a\"\nroot ::= \"b\"");
    FAIL();
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------------------------ JSON Schema

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A reference validator for the subset the compiler supports.
bool valid(const ojson& s, const ojson& v, const ojson& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    if (ref == "#") return valid(root, v, root);
    return valid(root.at(ojson::json_pointer(ref.substr(1))), v, root);
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum")) {
    bool any = false;
    for (const auto& e : s["enum"]) any = any || e == v;
    if (!any) return false;
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const auto& e : s["anyOf"]) any = any || valid(e, v, root);
    if (!any) return false;
  }
  if (s.contains("type")) {
    auto is = [&](const std::string& t) {
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      if (t == "string") return v.is_string();
      if (t == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      return v.is_null();
    };
    bool ok = false;
    if (s["type"].is_array()) {
      for (const auto& t : s["type"]) ok = ok || is(t);
    } else {
      ok = is(s["type"]);
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (s.contains("properties") && s["properties"].contains(it.key())) {
        if (!valid(s["properties"][it.key()], *it, root)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!valid(s["additionalProperties"], *it, root)) return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items"))
      for (const auto& e : v)
        if (!valid(s["items"], e, root)) return false;
  }
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    if (s.contains("minLength") && code_points(str) < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && code_points(str) > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>()))) return false;
  }
  return true;
}

// Random instances (valid by construction for the test schemas; the validator double-checks).
ojson generate(const ojson& s, const ojson& root, std::mt19937& rng, int depth = 0) {
  std::uniform_int_distribution<int> coin(0, 1), small(0, 3);
  if (s.is_boolean() || s.empty()) return depth > 2 ? ojson(small(rng)) : ojson{{"k", "v"}};
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return generate(ref == "#" ? root : root.at(ojson::json_pointer(ref.substr(1))), root, rng, depth + 1);
  }
  if (s.contains("const")) return s["const"];
  if (s.contains("enum")) return s["enum"][static_cast<size_t>(rng() % s["enum"].size())];
  if (s.contains("anyOf"))
    return generate(s["anyOf"][static_cast<size_t>(rng() % s["anyOf"].size())], root, rng, depth + 1);
  std::string t = s.contains("type")
                      ? (s["type"].is_array() ? s["type"][static_cast<size_t>(rng() % s["type"].size())] : s["type"])
                            .get<std::string>()
                      : "object";
  if (t == "object") {
    ojson o = ojson::object();
    if (s.contains("properties"))
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        bool req = false;
        if (s.contains("required"))
          for (const auto& r : s["required"]) req = req || r == it.key();
        if (req || coin(rng) || depth > 3) {
          if (!req && depth > 3) continue;
          o[it.key()] = generate(*it, root, rng, depth + 1);
        }
      }
    return o;
  }
  if (t == "array") {
    const int lo = s.value("minItems", 0), hi = s.value("maxItems", depth > 2 ? lo : lo + 3);
    ojson a = ojson::array();
    const int n = lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1));
    for (int i = 0; i < n; ++i) a.push_back(generate(s.value("items", ojson(true)), root, rng, depth + 1));
    return a;
  }
  if (t == "string") {
    if (s.contains("pattern")) return "ab-12";
    const int lo = s.value("minLength", 0), hi = s.value("maxLength", lo + 6);
    std::string str;
    const char* pieces[] = {"a", "Z", " ", "\"", "\\", "\n", "é", "日", "/", "\t"};
    const int n = lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1));
    for (int i = 0; i < n; ++i) str += pieces[rng() % 10];
    return str;
  }
  if (t == "integer") return static_cast<int64_t>(rng() % 20001) - 10000;
  if (t == "number") return (static_cast<double>(rng() % 20001) - 10000) / 64.0;
  if (t == "boolean") return coin(rng) == 1;
  return nullptr;
}

const std::vector<ojson>& test_schemas() {
  static const std::vector<ojson> s = {
      ojson::parse(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
        "tags":{"type":"array","items":{"type":"string","maxLength":3},"maxItems":3},"ok":{"type":"boolean"}},
        "required":["name","age","tags","ok"],"additionalProperties":false})"),
      ojson::parse(R"({"type":"object","properties":{"a":{"type":"number"},"b":{"enum":["x","y",3,null]},
        "c":{"type":["string","null"],"minLength":2}},"required":["b"]})"),
      ojson::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},"$ref":"#/$defs/node"})"),
      ojson::parse(R"({"anyOf":[{"type":"string","pattern":"^[a-z]+-\\d{2}$"},{"type":"array","items":{"const":"k"},
        "minItems":1,"maxItems":2}]})"),
      ojson::parse(
          R"({"type":"object","properties":{"id":{"type":"string","pattern":"^ab-\\d+$"},"x":{"type":"number"}},
        "required":["id"],"additionalProperties":{"type":"integer"}})"),
  };
  return s;
}

TEST(JsonSchema, AcceptedTextIsValidAndValidInstancesAreAccepted) {
  std::mt19937 rng(11);
  for (size_t k = 0; k < test_schemas().size(); ++k) {
    const ojson& schema = test_schemas()[k];
    auto c = bind_vocab(json_schema_grammar(schema), byte_vocab());
    std::vector<std::string> valid_texts;
    for (int i = 0; i < 200; ++i) {
      const ojson v = generate(schema, schema, rng);
      ASSERT_TRUE(valid(schema, v, schema)) << v.dump();
      // The compiler writes properties in schema order, which ordered_json keeps; compact and spaced layouts.
      const std::string compact_text = v.dump();
      std::string spaced;  // a space after every ',' and ':' outside strings (Python's json.dumps layout)
      bool in_str = false, escaped = false;
      for (const char ch : compact_text) {
        spaced += ch;
        if (in_str) {
          if (escaped)
            escaped = false;
          else if (ch == '\\')
            escaped = true;
          else if (ch == '"')
            in_str = false;
        } else if (ch == '"') {
          in_str = true;
        } else if (ch == ',' || ch == ':') {
          spaced += ' ';
        }
      }
      for (const std::string& text : {compact_text, spaced, " " + compact_text}) {
        ASSERT_TRUE(accepts(c, text)) << "schema " << k << ": " << text;
        valid_texts.push_back(text);
      }
      EXPECT_FALSE(accepts(c, "  " + compact_text));  // at most one space between tokens
    }
    // Mutations of valid texts and random strings: whatever the grammar accepts must parse and validate.
    const std::string alphabet = "{}[]\",:0123456789-.eE abxyk\\ntrufalsn";
    int accepted = 0;
    for (int i = 0; i < 6000; ++i) {
      std::string s = valid_texts[rng() % valid_texts.size()];
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits && !s.empty(); ++e) {
        const size_t pos = rng() % s.size();
        switch (rng() % 3) {
          case 0: s.erase(pos, 1); break;
          case 1: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
          default: s[pos] = alphabet[rng() % alphabet.size()]; break;
        }
      }
      if (!accepts(c, s)) continue;
      ++accepted;
      ojson v;
      ASSERT_NO_THROW(v = ojson::parse(s)) << "schema " << k << " accepted unparsable " << s;
      ASSERT_TRUE(valid(schema, v, schema)) << "schema " << k << " accepted invalid " << s;
    }
    EXPECT_GT(accepted, 0) << "schema " << k;
  }
}

TEST(JsonSchema, JsonObjectIsAnyObject) {
  auto c = bind_vocab(json_object_grammar(), byte_vocab());
  for (const char* s : {"{}", "{\"a\":[1,2,{\"b\":null}],\"c\":\"x\\u00e9\"}", " { \"k\" : true }", "{\"\":-0.5e+3}",
                        "{\"a\": [1, 2], \"b\": {\"c\": \"d\"}}"})
    EXPECT_TRUE(accepts(c, s)) << s;
  for (const char* s : {"[]", "{", "{\"a\"}", "{\"a\":01}", "{'a':1}", "\"x\"", "{\"a\":1,}", "{\n\"a\":1}", "{   }"})
    EXPECT_FALSE(accepts(c, s)) << s;
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  for (const char* kw : {"minimum", "format", "uniqueItems", "patternProperties", "not", "if", "prefixItems"}) {
    ojson s = {{"type", "object"}, {"properties", {{"x", {{"type", "string"}, {kw, 1}}}}}};
    try {
      json_schema_grammar(s);
      FAIL() << kw;
    } catch (const GrammarError& e) {
      EXPECT_EQ(e.keyword(), kw);
      EXPECT_NE(std::string(e.what()).find(kw), std::string::npos);
    }
  }
}

TEST(JsonSchema, InvalidSchemasAreErrors) {
  for (const char* s :
       {R"({"type":"strin"})", R"({"type":"object","required":"a"})", R"({"properties":[1]})", R"({"enum":[]})",
        R"({"$ref":"#/$defs/missing"})", R"({"type":"string","minLength":-1})", R"({"type":"string","pattern":"(a"})",
        R"({"anyOf":{}})", R"(false)", R"(3)", R"({"type":"array","minItems":3,"maxItems":1})"}) {
    try {
      json_schema_grammar(ojson::parse(s));
      FAIL() << s;
    } catch (const GrammarError& e) {
      EXPECT_TRUE(e.keyword().empty()) << s << ": " << e.what();
    }
  }
}

TEST(Compilers, BadInputIsAGrammarErrorNeverACrash) {
  std::mt19937 rng(17);
  const std::string gbnf_alpha = "root::=\"ab|()[]^-*+?{}0123,.# \n\\x";
  const std::string regex_alpha = "ab|()[]^$-*+?{}0123,.\\dws:?<>=!";
  int compiled = 0;
  for (int i = 0; i < 3000; ++i) {
    for (const auto& [alpha, is_gbnf] : {std::pair{gbnf_alpha, true}, std::pair{regex_alpha, false}}) {
      std::string t = random_string(rng, alpha, 24);
      if (is_gbnf) t = "root ::= " + t;
      try {
        auto g = is_gbnf ? gbnf_grammar(t) : regex_grammar(t);
        ++compiled;
        Matcher m(bind_vocab(g, byte_vocab()));
        m.accept_bytes("ab");
      } catch (const GrammarError&) {
      }
    }
  }
  EXPECT_GT(compiled, 100);
  EXPECT_THROW(regex_grammar(std::string(1000, '(') + "a" + std::string(1000, ')')), GrammarError);
  EXPECT_THROW(gbnf_grammar("root ::= " + std::string(1000, '(') + "\"a\"" + std::string(1000, ')')), GrammarError);
  EXPECT_THROW(regex_grammar("(a{1,100000}){1,100000}"), GrammarError);  // too many states
  // Random JSON values as schemas: compile or GrammarError.
  for (int i = 0; i < 2000; ++i) {
    std::string t = random_string(rng, "{}[]\":,tyeobjcrinpsxaml0123", 30);
    ojson s;
    try {
      s = ojson::parse(t);
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    try {
      json_schema_grammar(s);
    } catch (const GrammarError&) {
    }
  }
}

// ------------------------------------------------------------------------------------------------ masks

// A small vocabulary with multi-byte tokens that cross grammar boundaries ("\",", "{\"", "}]"...).
std::shared_ptr<const TokenVocab> small_vocab(std::mt19937& rng, size_t n_random) {
  std::vector<std::string> v = {"{",
                                "}",
                                "[",
                                "]",
                                "\"",
                                ",",
                                ":",
                                " ",
                                "\n",
                                "{\"",
                                "\":",
                                "\",",
                                "\"}",
                                "}]",
                                "],",
                                "\":\"",
                                "\",\"",
                                "1",
                                "12",
                                "0",
                                "-",
                                ".",
                                "5e",
                                "e+",
                                "true",
                                "false",
                                "null",
                                "nu",
                                "ll",
                                "name",
                                "age",
                                "tags",
                                "ok",
                                "\"name",
                                "a",
                                "b",
                                "ab",
                                "x",
                                "\\",
                                "\\n",
                                "é",
                                "\xc3",
                                "\xa9",
                                "<tool_call>",
                                "</tool_call>",
                                "<arg_key>",
                                "</arg_key>",
                                "<arg_value>",
                                "</arg_value>",
                                "get_weather",
                                "city",
                                "Paris",
                                "unit",
                                "celsius",
                                "\"c",
                                "k",
                                "v",
                                "-1",
                                "<｜tool▁calls▁begin｜>",
                                "<｜tool▁call▁begin｜>",
                                "function",
                                "<｜tool▁sep｜>",
                                "\n```json\n",
                                "\n```",
                                "<｜tool▁call▁end｜>",
                                "<｜tool▁calls▁end｜>",
                                "｜",
                                "▁"};
  for (int c = 0x20; c < 0x7F; ++c) v.push_back(std::string(1, static_cast<char>(c)));  // no dead ends
  const std::string alphabet = "{}[]\",: abcnrtuelsx0123456789-.\\";
  for (size_t i = 0; i < n_random; ++i) v.push_back(random_string(rng, alphabet, 4));
  v.push_back("");  // an id without bytes: never allowed
  v.push_back("<|end|>");
  return std::make_shared<TokenVocab>(v, std::vector<int32_t>{static_cast<int32_t>(v.size() - 1)});
}

void check_masks(const std::shared_ptr<const Grammar>& g, int walks, uint32_t seed) {
  std::mt19937 rng(seed);
  auto vocab = small_vocab(rng, 300);
  auto c = bind_vocab(g, vocab);
  const int32_t stop = vocab->stop_ids()[0];
  for (int w = 0; w < walks; ++w) {
    Matcher m(c);
    Matcher brute(c);
    std::vector<uint64_t> mask(vocab->mask_words());
    for (int step = 0; step < 60 && !m.is_complete(); ++step) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab->size()); ++id) {
        const bool bit = (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u;
        bool want;
        if (id == stop)
          want = brute.can_end();
        else
          want = !vocab->bytes(id).empty() && brute.viable(vocab->bytes(id));
        ASSERT_EQ(bit, want) << "walk " << w << " step " << step << " token '" << vocab->bytes(id) << "'";
        if (bit) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << "walk " << w << " step " << step << " seed " << seed;
      // Prefer continuing over stopping so that walks go deep.
      int32_t t = allowed[rng() % allowed.size()];
      if (t == stop && allowed.size() > 1 && rng() % 4 != 0) t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(t));
      ASSERT_TRUE(brute.accept_token(t));
    }
  }
}

TEST(Mask, EqualsBruteForceForJsonSchemas) {
  uint32_t seed = 1;
  for (const auto& s : test_schemas()) check_masks(json_schema_grammar(s), 12, seed++);
  check_masks(json_object_grammar(), 12, 99);
}

TEST(Mask, EqualsBruteForceForRegexGbnfChoiceAndTools) {
  check_masks(regex_grammar("(ab|x)+[0-9]{1,3}(\\.5)?"), 20, 2);
  check_masks(gbnf_grammar("root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= \"a\" | \"b\" | root"), 20, 3);
  check_masks(choice_grammar({"true", "false", "null", "nu"}), 10, 4);
  const ojson tools =
      ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},
      "required":["city"]}}}])");
  check_masks(tool_call_grammar(ToolSyntax::Glm, tools, "", true), 20, 5);
  check_masks(tool_call_grammar(ToolSyntax::DeepSeekV3, tools, "get_weather", false), 10, 6);
}

TEST(Mask, LargeVocabularyWalkMatchesBruteForce) {
  // Enough tokens that the per-node uncertain lists overflow into whole-trie walks for some nodes.
  std::mt19937 rng(21);
  std::vector<std::string> v;
  const std::string alphabet = "{}[]\",: abcnrtuelsx0123456789-.\\";
  for (int c = 0x20; c < 0x7F; ++c) v.push_back(std::string(1, static_cast<char>(c)));
  for (int i = 0; i < 6000; ++i) v.push_back(random_string(rng, alphabet, 5));
  // Word-like tokens: subtrees whose bytes all keep a string state where it is (the walk's bulk accept).
  for (int i = 0; i < 4000; ++i) v.push_back(" " + random_string(rng, "abcdefghijklmnopqrstuvwxyz", 7));
  for (int i = 0; i < 1000; ++i) v.push_back(random_string(rng, "abcdefghijklmnopqrstuvwxyz", 6) + "\",");
  v.push_back("<eos>");
  auto vocab = std::make_shared<TokenVocab>(v, std::vector<int32_t>{static_cast<int32_t>(v.size() - 1)});
  for (const auto& g : {json_schema_grammar(test_schemas()[1]), json_schema_grammar(test_schemas()[0]),
                        regex_grammar("[a-z ]{0,30}!"), gbnf_grammar("root ::= \"\\\"\" [a-z ]* \"\\\",\"")})
    for (int w = 0; w < 3; ++w) {
      auto c = bind_vocab(g, vocab);
      Matcher m(c), brute(c);
      std::vector<uint64_t> mask(vocab->mask_words());
      for (int step = 0; step < 40 && !m.is_complete(); ++step) {
        m.fill_mask(mask.data());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < static_cast<int32_t>(vocab->size()); ++id) {
          const bool bit = (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u;
          const bool want =
              vocab->is_stop(id) ? brute.can_end() : !vocab->bytes(id).empty() && brute.viable(vocab->bytes(id));
          ASSERT_EQ(bit, want) << "step " << step << " '" << vocab->bytes(id) << "'";
          if (bit) allowed.push_back(id);
        }
        ASSERT_FALSE(allowed.empty());
        const int32_t t = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(t));
        ASSERT_TRUE(brute.accept_token(t));
      }
    }
}

// ------------------------------------------------------------------------------------------------ tools

TEST(ToolGrammar, GlmCallsWithTypedArguments) {
  const ojson tools = ojson::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
    {"type":"function","function":{"name":"noargs","parameters":{"type":"object","properties":{}}}}])");
  auto any = bind_vocab(tool_call_grammar(ToolSyntax::Glm, tools, "", true), byte_vocab());
  EXPECT_TRUE(accepts(any, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"));
  EXPECT_TRUE(accepts(any,
                      "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>New York</arg_value>"
                      "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>\n<tool_call>noargs</tool_call>"));
  EXPECT_FALSE(accepts(any, "<tool_call>get_weather</tool_call>"));  // city is required
  EXPECT_FALSE(accepts(any,
                       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value>"
                       "<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>"));
  EXPECT_FALSE(accepts(any, "<tool_call>other</tool_call>"));
  auto named = bind_vocab(tool_call_grammar(ToolSyntax::Glm, tools, "noargs", false), byte_vocab());
  EXPECT_TRUE(accepts(named, "<tool_call>noargs</tool_call>"));
  EXPECT_FALSE(accepts(named, "<tool_call>noargs</tool_call><tool_call>noargs</tool_call>"));
  EXPECT_FALSE(accepts(named, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value></tool_call>"));
  auto ds = bind_vocab(tool_call_grammar(ToolSyntax::DeepSeekV3, tools, "get_weather", false), byte_vocab());
  EXPECT_TRUE(accepts(ds,
                      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                      "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"));
  EXPECT_THROW(tool_call_grammar(ToolSyntax::Glm, tools, "missing", false), GrammarError);
}

// ------------------------------------------------------------------------------------------------ constraint

TEST(Constraint, StartsAfterReasoningAndFinishesWhenComplete) {
  // ids: 0 "a", 1 "b", 2 "</think>", 3 stop
  auto vocab = std::make_shared<TokenVocab>(std::vector<std::string>{"a", "b", "", ""}, std::vector<int32_t>{3});
  auto c = bind_vocab(regex_grammar("ab"), vocab);
  GrammarConstraint k(c, /*start_after=*/2);
  std::vector<float> logits(5, 1.0f);
  k.mask(logits);
  for (float l : logits) EXPECT_EQ(l, 1.0f);  // reasoning: unconstrained
  k.accept(1);
  k.accept(2);  // </think>
  EXPECT_FALSE(k.finished());
  k.mask(logits);
  const float inf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_EQ(logits[1], inf);
  EXPECT_EQ(logits[2], inf);
  EXPECT_EQ(logits[3], inf);
  EXPECT_EQ(logits[4], inf);  // beyond the tokenizer's ids
  k.accept(0);
  std::fill(logits.begin(), logits.end(), 1.0f);
  k.mask(logits);
  EXPECT_EQ(logits[1], 1.0f);
  EXPECT_EQ(logits[0], inf);
  k.accept(1);
  EXPECT_TRUE(k.finished());
}

// allowed_bits (the device sampler's bitmask) says exactly what mask() says, step by step: inactive before the
// reasoning end, ids past the matcher's vocabulary disallowed, and against the interface's default (via mask()).
TEST(Constraint, AllowedBitsEqualTheMask) {
  auto c = bind_vocab(regex_grammar("[a-c]+(x|yz)?"), byte_vocab());  // 257 ids (256 = stop)
  for (int32_t start_after : {-1, static_cast<int32_t>('q')}) {
    GrammarConstraint k(c, start_after);
    const int64_t V = 300;  // the model's vocabulary: larger than the tokenizer's, not a multiple of 32
    const std::string text = std::string(start_after >= 0 ? "pq" : "") + "abcaby";
    for (size_t i = 0; i <= text.size(); ++i) {
      std::vector<float> row(static_cast<size_t>(V), 0.0f);
      k.mask(row);
      std::vector<uint32_t> bits(static_cast<size_t>((V + 31) / 32), 0u), base(bits.size(), 0u);
      const bool masked = k.allowed_bits(bits, V);
      EXPECT_EQ(masked, start_after < 0 || i >= 2) << "step " << i;
      k.LogitConstraint::allowed_bits(base, V);  // the interface's default, through mask()
      for (int64_t t = 0; t < V; ++t) {
        const bool allowed = row[static_cast<size_t>(t)] != -std::numeric_limits<float>::infinity();
        EXPECT_EQ((base[static_cast<size_t>(t >> 5)] >> (t & 31)) & 1u, allowed ? 1u : 0u) << "id " << t;
        if (masked)
          EXPECT_EQ((bits[static_cast<size_t>(t >> 5)] >> (t & 31)) & 1u, allowed ? 1u : 0u) << "id " << t;
        else
          EXPECT_TRUE(allowed);
      }
      if (i < text.size()) k.accept(static_cast<uint8_t>(text[i]));
    }
  }
}

TEST(Constraint, StopOnlyWhereTheGrammarCanEnd) {
  auto vocab = std::make_shared<TokenVocab>(std::vector<std::string>{"1", "x", ""}, std::vector<int32_t>{2});
  auto c = bind_vocab(regex_grammar("1+"), vocab);
  Matcher m(c);
  std::vector<uint64_t> mask(1);
  m.fill_mask(mask.data());
  EXPECT_EQ(mask[0], 0b001u);
  EXPECT_FALSE(m.accept_token(2));
  EXPECT_FALSE(m.accept_token(1));
  ASSERT_TRUE(m.accept_token(0));
  m.fill_mask(mask.data());
  EXPECT_EQ(mask[0], 0b101u);
  EXPECT_FALSE(m.is_complete());
  ASSERT_TRUE(m.accept_token(2));
  EXPECT_TRUE(m.is_complete());
}

}  // namespace
}  // namespace latent::structured
