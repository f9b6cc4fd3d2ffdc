// The bug-report archive reader (archive.h) and TraceReader over a window of a
// file: one test per way an archive from a stranger can be wrong, each made by
// editing the bytes of a real archive and asserting the exact refusal.
#include "archive.h"

#include <gtest/gtest.h>

#include <cstring>

#include "test_util.h"

namespace gradtrace {
namespace {

using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

// Header byte offsets (ustar), for surgery.
constexpr size_t kSizeField = 124;
constexpr size_t kSumField = 148;
constexpr size_t kTypeField = 156;

std::string Member(const std::string& name, const std::string& content) {
  auto h = TarHeader(name, content.size(), 1700000000);
  EXPECT_TRUE(h.ok()) << h.status().message();
  return *h + content + std::string(TarPadding(content.size()), '\0');
}
std::string End() { return std::string(2 * kTarBlock, '\0'); }

// Rewrites the checksum of the header at `at` after an edit, as a forger would.
void Reseal(std::string* tar, size_t at) {
  uint64_t sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) {
    sum += (i >= kSumField && i < kSumField + 8) ? ' ' : static_cast<uint8_t>((*tar)[at + i]);
  }
  std::snprintf(&(*tar)[at + kSumField], 7, "%06llo", static_cast<unsigned long long>(sum));
}
void SetName(std::string* tar, size_t at, const std::string& name) {
  std::memset(&(*tar)[at], 0, 100);
  std::memcpy(&(*tar)[at], name.data(), name.size());
  Reseal(tar, at);
}

TEST(Archive, ListsMembersAndReadsThemByteForByte) {
  TempDir dir;
  const std::string trace = dir.File("rank-00000.gtrace");
  testing::WriteSmallTrace(trace);
  const std::string trace_bytes = ReadBytes(trace);
  const std::string tar = Member("a/rank-00000.gtrace", trace_bytes) + Member("report.json", "{}\n") + End();
  const std::string path = dir.File("bug.gtpack");
  WriteBytes(path, tar);

  ASSERT_TRUE(LooksLikeArchive(path));
  EXPECT_FALSE(LooksLikeArchive(trace));
  auto a = Archive::Open(path);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(a->members().size(), 2u);
  EXPECT_EQ(a->members()[0].name, "a/rank-00000.gtrace");
  EXPECT_EQ(a->members()[0].offset, kTarBlock);
  EXPECT_EQ(a->members()[0].size, trace_bytes.size());
  EXPECT_EQ(*a->Read(a->members()[0]), trace_bytes);
  EXPECT_EQ(*a->Read(*a->Find("report.json")), "{}\n");
  EXPECT_EQ(a->Find("b/rank-00000.gtrace"), nullptr);

  // The member read in place gives the frames the file gives, at the same offsets.
  const ArchiveMember& m = a->members()[0];
  auto r = TraceReader::Open(TraceSource::Window(path, m.offset, m.size, a->NameOf(m)));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->path(), path + ":a/rank-00000.gtrace");
  EXPECT_TRUE((*r)->has_index());
  const testing::ReadResult whole = testing::ReadAll(trace);
  Frame f;
  size_t i = 0;
  while ((*r)->Next(&f)) {
    ASSERT_LT(i, whole.offsets.size());
    EXPECT_EQ(f.offset, whole.offsets[i++]);
  }
  EXPECT_TRUE((*r)->status().ok()) << (*r)->status().message();
  EXPECT_EQ(i, whole.offsets.size());
  EXPECT_TRUE(VerifyFile(TraceSource::Window(path, m.offset, m.size, a->NameOf(m))).ok());
}

TEST(Archive, SplitsArchiveArgumentsOnlyForRealArchives) {
  TempDir dir;
  const std::string path = dir.File("bug.gtpack");
  WriteBytes(path, Member("x", "1") + End());
  EXPECT_EQ(SplitArchiveArg(path + ":a"), std::make_pair(path, std::string("a")));
  EXPECT_EQ(SplitArchiveArg(path), std::make_pair(path, std::string()));
  EXPECT_EQ(SplitArchiveArg(dir.File("missing") + ":a"), std::make_pair(dir.File("missing") + ":a", std::string()));
  EXPECT_EQ(SplitArchiveArg(path + ":../a"), std::make_pair(path + ":../a", std::string()));
}

TEST(Archive, RefusesABadHeaderChecksumNamingTheOffset) {
  TempDir dir;
  std::string tar = Member("a/rank-00000.gtrace", "x") + Member("report.json", "{}") + End();
  tar[kTarBlock * 2 + 3] ^= 1;  // the second header's name
  const std::string path = dir.File("bug.gtpack");
  WriteBytes(path, tar);
  auto a = Archive::Open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Status::Code::kCorruption);
  EXPECT_EQ(a.status().message().rfind(path + ": offset 1024: header checksum mismatch", 0), 0u)
      << a.status().message();
}

TEST(Archive, RefusesAMemberSizeBeyondTheEndOfTheFile) {
  TempDir dir;
  std::string tar = Member("a/rank-00000.gtrace", std::string(600, 'x')) + End();
  std::snprintf(&tar[kSizeField], 12, "%011llo", 1ull << 32);
  Reseal(&tar, 0);
  const std::string path = dir.File("bug.gtpack");
  WriteBytes(path, tar);
  auto a = Archive::Open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Status::Code::kTruncated);
  EXPECT_EQ(a.status().message(), path +
                                      ": offset 0: member 'a/rank-00000.gtrace': size 4294967296 runs past the end of "
                                      "the archive (2048 bytes left)");
}

TEST(Archive, RefusesNamesThatLeaveTheArchive) {
  TempDir dir;
  const std::string path = dir.File("bug.gtpack");
  for (const auto& [name, why] :
       std::vector<std::pair<std::string, std::string>>{{"../etc/passwd", "climbs out of the archive"},
                                                        {"a/../../x", "climbs out of the archive"},
                                                        {"/etc/passwd", "absolute member name"},
                                                        {"a//rank-00000.gtrace", "empty part"},
                                                        {"a/./x", "'.' in the member name"},
                                                        {"a\\b", "backslash"}}) {
    EXPECT_FALSE(TarHeader(name, 1, 0).ok()) << name;  // the writer never makes one
    std::string tar = Member("placeholder", "1") + End();
    SetName(&tar, 0, name);
    WriteBytes(path, tar);
    auto a = Archive::Open(path);
    ASSERT_FALSE(a.ok()) << name;
    EXPECT_EQ(a.status().code(), Status::Code::kCorruption) << name;
    std::string shown = name;  // messages escape the backslash
    if (const size_t b = shown.find('\\'); b != std::string::npos) shown.replace(b, 1, "\\x5c");
    EXPECT_NE(a.status().message().find("member '" + shown + "': "), std::string::npos) << a.status().message();
    EXPECT_NE(a.status().message().find(why), std::string::npos) << a.status().message();
  }
}

TEST(Archive, RefusesLinksAndOtherMemberTypes) {
  TempDir dir;
  const std::string path = dir.File("bug.gtpack");
  for (char type : {'1', '2', '3', '4', '6', '7', 'x', 'g', 'L'}) {
    std::string tar = Member("a/rank-00000.gtrace", "1") + End();
    tar[kTypeField] = type;
    Reseal(&tar, 0);
    WriteBytes(path, tar);
    auto a = Archive::Open(path);
    ASSERT_FALSE(a.ok()) << type;
    EXPECT_NE(a.status().message().find("unsupported member type '" + std::string(1, type) + "'"), std::string::npos)
        << a.status().message();
  }
}

TEST(Archive, RefusesRepeatedNamesAndNonOctalSizes) {
  TempDir dir;
  const std::string path = dir.File("bug.gtpack");
  WriteBytes(path, Member("report.json", "1") + Member("report.json", "2") + End());
  auto a = Archive::Open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(), path + ": offset 1024: member 'report.json': repeated member name");

  std::string tar = Member("report.json", "1") + End();
  tar[kSizeField] = static_cast<char>(0x80);  // GNU base-256: never written, refused
  Reseal(&tar, 0);
  WriteBytes(path, tar);
  a = Archive::Open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(), path + ": offset 0: member 'report.json': size field is not octal");
}

// Fuzz finding 4 of docs/dev/fuzzing.md (fuzz_archive, crash-10f16134...): the stored checksum field
// was echoed raw, so a newline in it split the error over two lines. Header
// bytes in messages are now escaped; so are names, which are checked after
// the type and size.
TEST(Archive, FuzzFinding4HostileHeaderBytesStayOnOneLine) {
  TempDir dir;
  const std::string path = dir.File("bug.gtpack");
  std::string tar = Member("report.json", "1") + End();
  std::memcpy(&tar[kSumField], "\n0\x80\x81", 4);
  WriteBytes(path, tar);
  auto a = Archive::Open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message().find('\n'), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("stored '\\x0a0\\x80\\x81"), std::string::npos) << a.status().message();

  tar = Member("placeholder", "1") + End();
  SetName(&tar, 0, "a\nb");
  tar[kTypeField] = '\n';
  Reseal(&tar, 0);
  WriteBytes(path, tar);
  a = Archive::Open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(
      a.status().message(),
      path + ": offset 0: member 'a\\x0ab': unsupported member type '\\x0a' (regular files and directories only)");
}

// Cut at every block boundary and a byte either side: always an error naming
// the file, never a crash, and never a member that runs past the cut.
TEST(Archive, ReportsEveryTruncation) {
  TempDir dir;
  const std::string full = Member("a/rank-00000.gtrace", std::string(1500, 'x')) + Member("README.md", "hi") + End();
  const std::string path = dir.File("bug.gtpack");
  for (size_t cut = 0; cut < full.size() - 2 * kTarBlock; ++cut) {
    if (cut % kTarBlock > 1 && cut % kTarBlock < kTarBlock - 1) continue;
    WriteBytes(path, full.substr(0, cut));
    auto a = Archive::Open(path);
    ASSERT_FALSE(a.ok()) << "cut at " << cut;
    EXPECT_EQ(a.status().message().rfind(path + ": offset ", 0), 0u) << a.status().message();
  }
}

TEST(Archive, RefusesMoreMembersThanTheLimit) {
  TempDir dir;
  const std::string one = Member("d", "");
  std::string tar;
  tar.reserve((kMaxArchiveMembers + 1) * kTarBlock + 2 * kTarBlock);
  for (size_t i = 0; i <= kMaxArchiveMembers; ++i) {
    std::string h = one;
    std::snprintf(&h[0], 100, "m%zu", i);
    Reseal(&h, 0);
    tar += h;
  }
  tar += End();
  const std::string path = dir.File("bug.gtpack");
  WriteBytes(path, tar);
  auto a = Archive::Open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Status::Code::kLimitExceeded);
  EXPECT_NE(a.status().message().find("more than 131072 members"), std::string::npos) << a.status().message();
}

// The window, not the file, bounds the reader: a member cut short inside an
// archive is a truncated trace even though the file has bytes after it.
TEST(TraceWindow, BoundsEveryReadByTheWindow) {
  TempDir dir;
  const std::string trace = dir.File("rank-00000.gtrace");
  testing::WriteSmallTrace(trace);
  const std::string bytes = ReadBytes(trace);
  const std::string path = dir.File("blob");
  WriteBytes(path, std::string(1000, 'p') + bytes + bytes);  // prefix, the trace, then a second copy
  const uint64_t cut = bytes.size() - 40;                    // into the footer and index
  auto r = TraceReader::Open(TraceSource::Window(path, 1000, cut, "blob:t"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE((*r)->has_index());
  Frame f;
  while ((*r)->Next(&f)) {
  }
  EXPECT_EQ((*r)->status().code(), Status::Code::kTruncated) << (*r)->status().message();
  EXPECT_EQ((*r)->status().message().rfind("blob:t: offset ", 0), 0u) << (*r)->status().message();

  auto past = TraceReader::Open(TraceSource::Window(path, 1000, 3 * bytes.size(), "blob:t"));
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), Status::Code::kTruncated);
  EXPECT_NE(past.status().message().find("runs past the end of " + path), std::string::npos);
}

}  // namespace
}  // namespace gradtrace
