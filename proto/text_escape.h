// One escaping function per output format, applied to every string that
// comes from a trace, an archive or a path (parameter and group names,
// producer, configuration strings, directories, and the messages that quote
// them). Traces are attached to public bug reports: their bytes must not move
// a terminal's cursor, put raw HTML into a rendered report, or end a Markdown
// table row.
#pragma once

#include <string>
#include <string_view>

namespace gradtrace {

// Terminal text (and one-line error messages): every control byte (< 0x20 and
// 0x7f) as "\xNN" and every UTF-8 encoded C1 control (U+0080..U+009F) as
// "\u00NN"; all other bytes as given. The result holds no line break.
std::string TerminalSafe(std::string_view s);

// HTML text and attribute values (quoted with " or '): & < > " ' as entities.
std::string HtmlEscape(std::string_view s);

// Markdown inline text (a table cell, bold, a list item) that renders as `s`
// in GFM (GitHub) and in markdown-it with HTML enabled: control bytes as in
// TerminalSafe (no line break ends a table row), & < > as HTML entities (no
// raw HTML, no entity of the input's), and \ ` * _ [ ] ~ | backslash-escaped
// (no code span, emphasis, link or cell boundary of the input's). '@' and '#'
// are written as "&#64;" and "&#35;" followed by "&#8203;" (a zero-width
// space, the one thing the rendered text gains): GitHub finds @mentions and
// issue references (#123, owner/repo#123) in the rendered text, where an
// entity is already decoded, so only the space keeps "@octocat" from pinging
// a user and "owner/repo#123" from cross-referencing an issue; the entities
// keep them from bots that read the raw Markdown. Code spans (MarkdownCode)
// need neither: GitHub links nothing inside them.
std::string MarkdownText(std::string_view s);

// Where a Markdown code span goes: GFM splits a table row at every '|' that is
// not backslash-escaped, inside code spans too (and then drops the backslash).
enum class MarkdownPlace { kText, kTableCell };

// A Markdown code span showing `s` verbatim (control bytes as in
// TerminalSafe): fenced by one backtick more than the longest run of backticks
// in `s`, padded with a space where `s` starts or ends with a backtick; in a
// table cell each '|' written as "\|".
std::string MarkdownCode(std::string_view s, MarkdownPlace place = MarkdownPlace::kText);

// A fenced code block around `body` (lines ending in '\n', each string from
// outside passed through TerminalSafe by the caller): the fence is one
// backtick longer than the longest run of backticks in `body`, at least 3.
std::string MarkdownCodeBlock(std::string_view info, std::string_view body);

}  // namespace gradtrace
