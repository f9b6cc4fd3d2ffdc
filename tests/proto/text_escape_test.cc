// The escaping of every string from a trace, an archive or a path, per output
// format (issue 20: raw HTML, broken tables and terminal escape sequences).
#include "text_escape.h"

#include <gtest/gtest.h>

namespace gradtrace {
namespace {

TEST(TerminalSafe, ControlBytesBecomeVisibleEscapes) {
  EXPECT_EQ(TerminalSafe("embed.weight"), "embed.weight");
  EXPECT_EQ(TerminalSafe("a\x1b[2Jb"), "a\\x1b[2Jb");  // erase the screen
  EXPECT_EQ(TerminalSafe("run\x1b]0;title\x07"), "run\\x1b]0;title\\x07");
  EXPECT_EQ(TerminalSafe("a\r\nb\tc\x7f"), "a\\x0d\\x0ab\\x09c\\x7f");
  EXPECT_EQ(TerminalSafe(std::string("a\0b", 3)), "a\\x00b");
  // C1 controls as UTF-8 (U+009B is CSI on some terminals); other UTF-8 and invalid bytes pass.
  EXPECT_EQ(TerminalSafe("a\xc2\x9b"
                         "2Jb"),
            "a\\u009b2Jb");
  EXPECT_EQ(TerminalSafe("\xc3\xa9t\xc3\xa9 \xc2\xa0 \xff \xc2"), "\xc3\xa9t\xc3\xa9 \xc2\xa0 \xff \xc2");
}

TEST(HtmlEscape, EscapesMarkupAndBothQuotes) {
  EXPECT_EQ(HtmlEscape("<img src=x onerror=\"a('b')\"> & more"),
            "&lt;img src=x onerror=&quot;a(&#39;b&#39;)&quot;&gt; &amp; more");
}

TEST(MarkdownText, NoRawHtmlEntityOrMarkupSurvives) {
  EXPECT_EQ(MarkdownText("ds-4530 (loss / sp) 2.000"), "ds-4530 (loss / sp) 2.000");
  EXPECT_EQ(MarkdownText("<svg onload=alert(1)>"), "&lt;svg onload=alert(1)&gt;");
  EXPECT_EQ(MarkdownText("&lt; &#60;"), "&amp;lt; &amp;&#35;&#8203;60;");
  EXPECT_EQ(MarkdownText("a|b\r\nc"), "a\\|b\\x0d\\x0ac");  // one table cell, one line
  EXPECT_EQ(MarkdownText("`code` *em* _em_ [link](x) ~~s~~ \\"),
            "\\`code\\` \\*em\\* \\_em\\_ \\[link\\](x) \\~\\~s\\~\\~ \\\\");
}

// Issue 20: GitHub finds mentions and issue references in the rendered text (entities decoded), so a
// zero-width space follows each '@' and '#'; the entities keep them from bots reading the raw Markdown.
TEST(MarkdownText, MentionsAndIssueReferencesStayInert) {
  EXPECT_EQ(MarkdownText("@octocat"), "&#64;&#8203;octocat");
  EXPECT_EQ(MarkdownText("owner/repo#123, #45, GH-6"), "owner/repo&#35;&#8203;123, &#35;&#8203;45, GH-6");
  EXPECT_EQ(MarkdownText("@pytorchbot merge -f"), "&#64;&#8203;pytorchbot merge -f");
  EXPECT_EQ(MarkdownText("a@b.c"), "a&#64;&#8203;b.c");
  // Names without them read as they are.
  EXPECT_EQ(MarkdownText("layers.0.mlp.fc1.weight"), "layers.0.mlp.fc1.weight");
  EXPECT_EQ(MarkdownText("world 4 (dp 2 x sp 2), ZeRO-2"), "world 4 (dp 2 x sp 2), ZeRO-2");
}

TEST(MarkdownCode, MentionsStayVerbatimInACodeSpan) {  // GitHub links nothing inside code
  EXPECT_EQ(MarkdownCode("@octocat/repo#1"), "`@octocat/repo#1`");
}

TEST(MarkdownCode, FencedPastEveryBacktickRunAndShownVerbatim) {
  EXPECT_EQ(MarkdownCode("layers.0.attn.qkv.weight"), "`layers.0.attn.qkv.weight`");
  EXPECT_EQ(MarkdownCode("a`b"), "``a`b``");
  EXPECT_EQ(MarkdownCode("a``b`"), "``` a``b` ```");  // padded: it ends with a backtick
  EXPECT_EQ(MarkdownCode("`a"), "`` `a ``");
  EXPECT_EQ(MarkdownCode(" a "), "`  a  `");  // CommonMark strips one space from each end
  EXPECT_EQ(MarkdownCode("   "), "`   `");
  EXPECT_EQ(MarkdownCode(""), "` `");
  EXPECT_EQ(MarkdownCode("<img src=x>&amp;"), "`<img src=x>&amp;`");  // a code span shows markup as text
  EXPECT_EQ(MarkdownCode("a\rb\x1b"), "`a\\x0db\\x1b`");
}

TEST(MarkdownCode, PipesAreEscapedInTableCellsOnly) {
  EXPECT_EQ(MarkdownCode("a|b"), "`a|b`");
  EXPECT_EQ(MarkdownCode("a|b", MarkdownPlace::kTableCell), "`a\\|b`");
  // GFM drops the backslash before every '|' of a cell, so "a\|b" comes back as itself.
  EXPECT_EQ(MarkdownCode("a\\|b", MarkdownPlace::kTableCell), "`a\\\\|b`");
}

TEST(MarkdownCodeBlock, FenceOutlastsTheBody) {
  EXPECT_EQ(MarkdownCodeBlock("sh", "gradtrace-diff bug.gtpack\n"), "```sh\ngradtrace-diff bug.gtpack\n```\n");
  EXPECT_EQ(MarkdownCodeBlock("sh", "x ````` y"), "``````sh\nx ````` y\n``````\n");
}

}  // namespace
}  // namespace gradtrace
