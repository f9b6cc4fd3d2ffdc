#include "load/rename.h"

#include "text_escape.h"

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
    return Status::InvalidArgument("--rename '" + TerminalSafe(text) + "': expected REGEX=REPLACEMENT");
  }
  std::string pattern = text.substr(0, eq);
  // '\=' only escapes the separator.
  for (size_t i; (i = pattern.find("\\=")) != std::string::npos;) pattern.erase(i, 1);
  auto compiled = NamePattern::Compile(pattern);
  if (!compiled.ok()) {
    // A rule may come from a stranger's archive: quoted, like RE2's message (which quotes the pattern), as one line.
    return Status::InvalidArgument("--rename '" + TerminalSafe(text) +
                                   "': bad regular expression: " + TerminalSafe(compiled.status().message()));
  }
  return RenameRule{text, std::move(compiled).value(), text.substr(eq + 1)};
}

std::string ApplyRenames(const std::vector<RenameRule>& rules, const std::string& name) {
  std::string out = name;
  for (const auto& r : rules) out = r.pattern.ReplaceAll(out, r.replacement);
  return out;
}

}  // namespace gradtrace::diff
