// The runtime's LogitConstraint (runtime/logit_constraint.h) over a Matcher, and the grammars of the models'
// tool-call syntax.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "runtime/logit_constraint.h"
#include "structured/matcher.h"

namespace latent::structured {

// Masks the logits with the matcher's allowed ids. start_after >= 0: unconstrained until that token (the
// reasoning end `</think>`) has been emitted, constrained from the next token on.
class GrammarConstraint : public LogitConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const CompiledGrammar> g, int32_t start_after);
  void mask(std::span<float> logits) override;
  bool allowed_bits(std::span<uint32_t> words, int64_t vocab) override;
  void accept(int32_t token) override;
  bool finished() const override;
  const Matcher& matcher() const { return m_; }

 private:
  Matcher m_;
  int32_t start_after_;
  bool active_;
  std::vector<uint64_t> words_;
  // words_ = the matcher's allowed ids (the stop ids when nothing can continue); false when inactive.
  bool fill_words();
};

LogitConstraintFactory constraint_factory(std::shared_ptr<const CompiledGrammar> g, int32_t start_after);

enum class ToolSyntax { Glm, DeepSeekV3, DeepSeekV31 };

// Output = one tool call (or, with `parallel`, one or more) in the model's syntax, with arguments valid for the
// tool's `parameters` schema. tools: the request's [{type:"function", function:{name, parameters}}]; only: the
// tool named by tool_choice ("" = any of them). GLM values are typed as the GLM parser reads them: a property
// declared "string" is raw text (no '<'), any other is JSON. Throws GrammarError (naming the tool) when a schema
// cannot be compiled.
std::shared_ptr<const Grammar> tool_call_grammar(ToolSyntax syntax, const nlohmann::ordered_json& tools,
                                                 const std::string& only, bool parallel);

}  // namespace latent::structured
