// A bug-report archive (gradtrace-pack's .gtpack): a POSIX ustar file whose
// members are read in place -- trace files by TraceReader over a byte window
// (TraceSource), small text members whole. The reader trusts nothing: it
// reads 512-byte headers only, and refuses a bad header checksum, a member
// running past the end of the file, a name that could escape a directory
// (absolute, "..", empty), member types other than regular files and
// directories, repeated names and more than kMaxArchiveMembers members.
// Layout and rules: FORMAT.md, "Appendix: bug-report archives".
//
// Header (512 bytes, the ustar fields we read; numbers are octal text):
//   name[100] @0 | size[12] @124 | chksum[8] @148 | typeflag @156 |
//   magic "ustar" @257 | prefix[155] @345
// Data follows in 512-byte blocks; two zero blocks end the archive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace gradtrace {

inline constexpr uint64_t kTarBlock = 512;
// A pack holds two sets of ranks plus a few text members; far more members
// than any world we trace means a hostile file, not a bigger job.
inline constexpr size_t kMaxArchiveMembers = 1 << 17;
// Whole-member reads (reports, environment) are for small text members.
inline constexpr uint64_t kMaxTextMember = 64u << 20;

struct ArchiveMember {
  std::string name;     // "a/rank-00000.gtrace", "report.json", ...
  uint64_t offset = 0;  // first data byte in the archive file
  uint64_t size = 0;
};

class Archive {
 public:
  // Reads the member table of `path`. Errors are one line naming the file
  // (and the member, where there is one): IoError, Corruption, Truncated,
  // LimitExceeded.
  static Expected<Archive> Open(const std::string& path);

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  const std::vector<ArchiveMember>& members() const { return members_; }
  const ArchiveMember* Find(const std::string& name) const;  // null when absent
  // The whole member, for text members of at most kMaxTextMember bytes.
  Expected<std::string> Read(const ArchiveMember& member) const;
  // "<archive>:<member>", how messages name a member.
  std::string NameOf(const ArchiveMember& member) const { return path_ + ":" + member.name; }

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  std::vector<ArchiveMember> members_;
};

// True when `path` is a regular file that starts with a ustar header (magic
// only; Open checks the rest). Trace sets are directories, so this tells an
// archive argument from a trace set without guessing from the name.
bool LooksLikeArchive(const std::string& path);

// "bug.gtpack:a" -> {"bug.gtpack", "a"} when bug.gtpack is an archive and the
// suffix is a set name (letters, digits, '-', '_'); otherwise {arg, ""}.
std::pair<std::string, std::string> SplitArchiveArg(const std::string& arg);

// Builds one ustar header for a regular file (mode 0644, mtime given, so a
// pack is reproducible). InvalidArgument for a name the reader would refuse
// or longer than 100 bytes.
Expected<std::string> TarHeader(const std::string& name, uint64_t size, int64_t mtime);
// Zero bytes that pad a member of `size` bytes to the next block.
inline uint64_t TarPadding(uint64_t size) { return (kTarBlock - size % kTarBlock) % kTarBlock; }
// A member name the reader accepts: relative, no "." or ".." part, no empty
// part, no control characters or backslashes; "" when fine, else why not.
std::string BadMemberName(const std::string& name);

}  // namespace gradtrace
