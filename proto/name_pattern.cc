#include "name_pattern.h"

#include <re2/re2.h>

namespace gradtrace {
namespace {

// Bounds the compiled program and its DFA cache: a pattern from a stranger's
// archive cannot take more memory than this.
constexpr int64_t kMaxMemory = 8 << 20;

// ECMAScript's $-syntax in RE2's \-syntax.
std::string Rewrite(const std::string& replacement, int groups) {
  std::string out;
  for (size_t i = 0; i < replacement.size(); ++i) {
    char c = replacement[i];
    char next = i + 1 < replacement.size() ? replacement[i + 1] : '\0';
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '$' && next == '$') {
      out += '$';
      ++i;
    } else if (c == '$' && next == '&') {
      out += "\\0";
      ++i;
    } else if (c == '$' && next >= '0' && next <= '9') {
      if (next - '0' <= groups) out += std::string("\\") + next;  // a group the pattern lacks is empty
      ++i;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Expected<NamePattern> NamePattern::Compile(const std::string& pattern) {
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(kMaxMemory);
  auto re = std::make_unique<RE2>(pattern, options);
  if (!re->ok()) return Status::InvalidArgument(re->error());
  NamePattern p;
  p.re_ = std::move(re);
  return p;
}

NamePattern::NamePattern(NamePattern&&) noexcept = default;
NamePattern& NamePattern::operator=(NamePattern&&) noexcept = default;
NamePattern::~NamePattern() = default;

bool NamePattern::Search(const std::string& name) const { return RE2::PartialMatch(name, *re_); }

std::string NamePattern::ReplaceAll(const std::string& name, const std::string& replacement) const {
  std::string out = name;
  RE2::GlobalReplace(&out, *re_, Rewrite(replacement, re_->NumberOfCapturingGroups()));
  return out;
}

}  // namespace gradtrace
