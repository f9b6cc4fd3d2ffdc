// Name patterns (--rename, an archive's diff.renames, --capture-params): RE2,
// linear in the name, with ECMAScript's replacement rules.
#include "name_pattern.h"

#include <gtest/gtest.h>

namespace gradtrace {
namespace {

NamePattern Must(const std::string& pattern) {
  auto p = NamePattern::Compile(pattern);
  EXPECT_TRUE(p.ok()) << pattern << ": " << p.status().message();
  return std::move(p).value();
}

TEST(NamePattern, ReplacesEveryMatchWithEcmaScriptReferences) {
  EXPECT_EQ(Must("^module\\.").ReplaceAll("module.layers.0.weight", ""), "layers.0.weight");
  EXPECT_EQ(Must("layers\\.(\\d+)").ReplaceAll("layers.3.w layers.12.b", "h$1"), "h3.w h12.b");
  EXPECT_EQ(Must("(a)(b)").ReplaceAll("ab", "$2$1[$&]$$"), "ba[ab]$");
  EXPECT_EQ(Must("(a)").ReplaceAll("a", "$5|$x|\\"), "|$x|\\");  // a missing group is empty, the rest literal
  EXPECT_EQ(Must("x*").ReplaceAll("abc", "-"), "-a-b-c-");       // empty matches, as std::regex_replace
  EXPECT_EQ(Must("^(.).*$").ReplaceAll("\xc3\xa9t\xc3\xa9", "$1"), "\xc3\xa9");  // UTF-8: never half a character
}

TEST(NamePattern, Searches) {
  EXPECT_TRUE(Must("attn").Search("layers.0.attn.q.weight"));
  EXPECT_FALSE(Must("^attn").Search("layers.0.attn.q.weight"));
}

TEST(NamePattern, RejectsWhatRe2CannotRunInLinearTime) {
  auto backref = NamePattern::Compile("(a)\\1");
  ASSERT_FALSE(backref.ok());
  EXPECT_NE(backref.status().message().find("escape"), std::string::npos) << backref.status().message();
  EXPECT_FALSE(NamePattern::Compile("(?=a)").ok());
  EXPECT_FALSE(NamePattern::Compile("(").ok());
  std::string huge_pattern;
  for (int i = 0; i < 200; ++i) huge_pattern += ".{1000}";  // 200,000 UTF-8 '.': over the memory budget
  auto huge = NamePattern::Compile(huge_pattern);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("too"), std::string::npos) << huge.status().message();
}

// The issue's case: std::regex took 1.3 s at 22 characters, doubling per character.
TEST(NamePattern, ExponentialBacktrackingPatternIsLinear) {
  NamePattern p = Must("(.|.)*#");
  std::string name(100000, 'a');
  EXPECT_EQ(p.ReplaceAll(name, "x"), name);
  EXPECT_FALSE(p.Search(name));
  name += '#';
  EXPECT_EQ(p.ReplaceAll(name, "x"), "x");  // a backtracking engine never gets here (ctest's timeout fails it)
}

}  // namespace
}  // namespace gradtrace
