// libFuzzer target: a rename rule and a parameter name, as an archive's
// diff.renames or --rename would bring them (input: RULE '\n' NAME). Parsing
// fails with one line, or the rule applies to the name; RE2 keeps every
// application linear, so a slow input is a timeout finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "load/rename.h"

using namespace gradtrace;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const std::string rule = input.substr(0, newline);
  std::string name = newline == std::string::npos ? "layers.0.attn.q_proj.weight" : input.substr(newline + 1);
  auto parsed = diff::ParseRenameRule(rule);
  if (!parsed.ok()) {
    fuzz::CheckOneLine(parsed.status());
    return 0;
  }
  std::vector<diff::RenameRule> rules;
  rules.push_back(std::move(parsed).value());
  // Twice over its own output: a replacement may grow the name, never without bound.
  for (int i = 0; i < 2; ++i) {
    std::string renamed = diff::ApplyRenames(rules, name);
    if (renamed.size() > 2 * (name.size() + 1) * (rule.size() + 1)) fuzz::Fail("a rename grew beyond its bound");
    name = std::move(renamed);
  }
  return 0;
}
