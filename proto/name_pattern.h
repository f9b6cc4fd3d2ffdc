// Regular expressions on parameter names, for every rule that can arrive from
// a file or the command line (--rename, an archive's diff.renames,
// --capture-params). RE2 matches in time linear in the name, whatever the
// pattern: std::regex backtracks, so '(.|.)*#' on a 40-character name took
// days. Syntax: RE2's (https://github.com/google/re2/wiki/Syntax), which is
// ECMAScript's without back-references or look-around; names match as UTF-8.
#pragma once

#include <memory>
#include <string>

#include "status.h"

namespace re2 {
class RE2;
}

namespace gradtrace {

class NamePattern {
 public:
  // InvalidArgument "<why>" for a pattern RE2 rejects (syntax, or a program
  // larger than its memory budget).
  static Expected<NamePattern> Compile(const std::string& pattern);

  NamePattern(NamePattern&&) noexcept;
  NamePattern& operator=(NamePattern&&) noexcept;
  ~NamePattern();

  bool Search(const std::string& name) const;  // a match anywhere in name
  // Every non-overlapping match replaced by `replacement`, in which $0-$9 and
  // $& are the match's groups ($N beyond the pattern's groups is empty), $$ a
  // dollar, and any other character literal: ECMAScript's replacement rules,
  // so rules written for std::regex keep their meaning.
  std::string ReplaceAll(const std::string& name, const std::string& replacement) const;

 private:
  NamePattern() = default;
  std::unique_ptr<re2::RE2> re_;
};

}  // namespace gradtrace
