// Rename rules ('REGEX=REPL'), applied in order to parameter names on both
// sides before alignment, e.g. 'module\.=' strips the prefix DeepSpeed's
// engine wrapper adds. REGEX is RE2 syntax (linear-time: a rule from a
// stranger's archive cannot hang the diff); REPL may use $1-style
// back-references (proto/name_pattern.h).
#pragma once

#include <string>
#include <vector>

#include "name_pattern.h"
#include "status.h"

namespace gradtrace::diff {

struct RenameRule {
  std::string text;  // as given
  NamePattern pattern;
  std::string replacement;
};

// Splits at the first '=' not preceded by a backslash ('\=' is a literal '=' in
// the pattern). InvalidArgument for a missing '=' or a bad regex.
Expected<RenameRule> ParseRenameRule(const std::string& text);

// Every rule, in order, each replacing all matches.
std::string ApplyRenames(const std::vector<RenameRule>& rules, const std::string& name);

}  // namespace gradtrace::diff
