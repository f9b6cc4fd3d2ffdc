#include "rename.h"

namespace gradtrace::diff {

Expected<RenameRule> ParseRenameRule(const std::string& text) {
  size_t eq = std::string::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
      continue;
    }
    if (text[i] == '=') {
      eq = i;
      break;
    }
  }
  if (eq == std::string::npos) {
    return Status::InvalidArgument("--rename '" + text + "': expected REGEX=REPLACEMENT");
  }
  std::string pattern = text.substr(0, eq);
  // '\=' only escapes the separator; std::regex would reject it.
  for (size_t i; (i = pattern.find("\\=")) != std::string::npos;) pattern.erase(i, 1);
  RenameRule rule;
  rule.text = text;
  rule.replacement = text.substr(eq + 1);
  try {
    rule.pattern = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status::InvalidArgument("--rename '" + text + "': bad regular expression: " + e.what());
  }
  return rule;
}

std::string ApplyRenames(const std::vector<RenameRule>& rules, const std::string& name) {
  std::string out = name;
  for (const auto& r : rules) out = std::regex_replace(out, r.pattern, r.replacement);
  return out;
}

}  // namespace gradtrace::diff
