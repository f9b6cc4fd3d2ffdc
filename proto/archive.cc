// Reading and writing ustar headers for bug-report archives. Order of checks
// per header: magic, checksum, type, size (octal, within the file), name.
#include "archive.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "regular_file.h"

namespace gradtrace {
namespace {

constexpr size_t kNameOff = 0, kNameLen = 100;
constexpr size_t kModeOff = 100, kUidOff = 108, kGidOff = 116;
constexpr size_t kSizeOff = 124, kSizeLen = 12;
constexpr size_t kMtimeOff = 136;
constexpr size_t kSumOff = 148, kSumLen = 8;
constexpr size_t kTypeOff = 156;
constexpr size_t kMagicOff = 257;
constexpr size_t kVersionOff = 263;
constexpr size_t kPrefixOff = 345, kPrefixLen = 155;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

bool ReadAt(std::FILE* f, uint64_t offset, void* out, size_t n) {
  if (fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0) return false;
  return std::fread(out, 1, n, f) == n;
}

// POSIX: magic "ustar\0" version "00"; GNU tar writes "ustar " " \0".
bool HasUstarMagic(const uint8_t* h) { return std::memcmp(h + kMagicOff, "ustar", 5) == 0; }

// The sum of the header's bytes with the checksum field read as spaces.
uint64_t HeaderSum(const uint8_t* h) {
  uint64_t sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) sum += (i >= kSumOff && i < kSumOff + kSumLen) ? ' ' : h[i];
  return sum;
}

// An octal field: optional leading spaces, digits, then NUL/space to the end.
// False for anything else (GNU base-256 numbers included: we never write them).
bool ParseOctal(const uint8_t* p, size_t len, uint64_t* out) {
  size_t i = 0;
  while (i < len && p[i] == ' ') ++i;
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < len && p[i] >= '0' && p[i] <= '7'; ++i, ++digits) {
    if (v >> 60) return false;
    v = v * 8 + (p[i] - '0');
  }
  if (digits == 0) return false;
  for (; i < len; ++i) {
    if (p[i] != '\0' && p[i] != ' ') return false;
  }
  *out = v;
  return true;
}

std::string Field(const uint8_t* p, size_t len) {
  size_t n = 0;
  while (n < len && p[n] != '\0') ++n;
  return std::string(reinterpret_cast<const char*>(p), n);
}

// Header bytes for a message: printable ASCII kept, anything else as \xNN,
// so a hostile field never breaks the one-line error.
std::string Printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// len - 1 octal digits, zero-padded, then NUL; v must fit (callers check).
void PutOctal(char* p, size_t len, uint64_t v) {
  for (size_t i = len - 1; i-- > 0; v >>= 3) p[i] = static_cast<char>('0' + (v & 7));
  p[len - 1] = '\0';
}

}  // namespace

std::string BadMemberName(const std::string& name) {
  if (name.empty()) return "empty member name";
  if (name.front() == '/') return "absolute member name";
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f || c == '\\') return "control character or backslash in the member name";
  }
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    const std::string part = name.substr(start, end - start);
    if (part == "..") return "member name climbs out of the archive ('..')";
    if (part == ".") return "'.' in the member name";
    // An empty part is a doubled or trailing slash; a directory member's trailing slash is fine.
    if (part.empty() && end != name.size()) return "empty part in the member name";
    start = end + 1;
  }
  return "";
}

Expected<Archive> Archive::Open(const std::string& path) {
  auto opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<std::FILE, FileCloser> f(*opened);
  struct stat st;
  if (fstat(fileno(f.get()), &st) != 0) return Status::IoError(path + ": cannot stat: " + std::strerror(errno));
  Archive a;
  a.path_ = path;
  a.file_size_ = static_cast<uint64_t>(st.st_size);
  auto at = [&](uint64_t offset) { return path + ": offset " + std::to_string(offset) + ": "; };
  std::set<std::string> names;
  uint64_t off = 0;
  uint8_t h[kTarBlock];
  for (;;) {
    if (a.file_size_ - off < kTarBlock) {
      return Status::Truncated(at(off) + (off == 0 ? "not an archive: shorter than one 512-byte header"
                                                   : "archive cut short: no end-of-archive block"));
    }
    if (!ReadAt(f.get(), off, h, kTarBlock)) return Status::IoError(at(off) + "read failed: " + std::strerror(errno));
    if (AllZero(h, kTarBlock)) break;  // end of archive (a second zero block may follow; nothing after is read)
    if (!HasUstarMagic(h)) return Status::Corruption(at(off) + "not a ustar header (bad magic)");
    uint64_t stored_sum = 0;
    if (!ParseOctal(h + kSumOff, kSumLen, &stored_sum) || stored_sum != HeaderSum(h)) {
      char computed[24];
      std::snprintf(computed, sizeof computed, "%06llo", static_cast<unsigned long long>(HeaderSum(h)));
      return Status::Corruption(at(off) + "header checksum mismatch (stored '" +
                                Printable(Field(h + kSumOff, kSumLen)) + "', computed " + computed + ", octal)");
    }
    std::string name = Field(h + kNameOff, kNameLen);
    const std::string prefix = Field(h + kPrefixOff, kPrefixLen);
    if (!prefix.empty()) name = prefix + "/" + name;
    auto member = [&] { return at(off) + "member '" + Printable(name) + "': "; };
    const char type = static_cast<char>(h[kTypeOff]);
    if (type != '0' && type != '\0' && type != '5') {
      return Status::Corruption(member() + "unsupported member type '" + Printable(std::string(1, type)) +
                                "' (regular files and directories only)");
    }
    uint64_t size = 0;
    if (!ParseOctal(h + kSizeOff, kSizeLen, &size)) return Status::Corruption(member() + "size field is not octal");
    if (const std::string bad = BadMemberName(name); !bad.empty()) return Status::Corruption(member() + bad);
    const uint64_t data = off + kTarBlock;
    if (size > a.file_size_ - data) {
      return Status::Truncated(member() + "size " + std::to_string(size) + " runs past the end of the archive (" +
                               std::to_string(a.file_size_ - data) + " bytes left)");
    }
    if (type == '5') {
      if (size != 0) return Status::Corruption(member() + "directory member with data");
    } else {
      if (!names.insert(name).second) return Status::Corruption(member() + "repeated member name");
      if (a.members_.size() >= kMaxArchiveMembers) {
        return Status::LimitExceeded(member() + "more than " + std::to_string(kMaxArchiveMembers) + " members");
      }
      a.members_.push_back({name, data, size});
    }
    off = data + size + TarPadding(size);
    if (off > a.file_size_) return Status::Truncated(member() + "padding runs past the end of the archive");
  }
  return a;
}

const ArchiveMember* Archive::Find(const std::string& name) const {
  for (const ArchiveMember& m : members_) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

Expected<std::string> Archive::Read(const ArchiveMember& m) const {
  if (m.size > kMaxTextMember) {
    return Status::LimitExceeded(NameOf(m) + ": " + std::to_string(m.size) + " bytes, more than a text member's " +
                                 std::to_string(kMaxTextMember));
  }
  auto opened = OpenRegularFile(path_);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<std::FILE, FileCloser> f(*opened);
  std::string out(m.size, '\0');
  if (m.size > 0 && !ReadAt(f.get(), m.offset, out.data(), out.size())) {
    return Status::IoError(NameOf(m) + ": read failed (archive changed while reading?)");
  }
  return out;
}

bool LooksLikeArchive(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(kTarBlock)) return false;
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  uint8_t h[kTarBlock];
  return f && ReadAt(f.get(), 0, h, kTarBlock) && HasUstarMagic(h);
}

std::pair<std::string, std::string> SplitArchiveArg(const std::string& arg) {
  const size_t colon = arg.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == arg.size()) return {arg, ""};
  const std::string set = arg.substr(colon + 1);
  for (char c : set) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return {arg, ""};
  }
  const std::string path = arg.substr(0, colon);
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return {arg, ""};
  return {path, set};
}

Expected<std::string> TarHeader(const std::string& name, uint64_t size, int64_t mtime) {
  if (const std::string bad = BadMemberName(name); !bad.empty()) return Status::InvalidArgument(name + ": " + bad);
  if (name.size() > kNameLen) {
    return Status::InvalidArgument(name + ": member name longer than " + std::to_string(kNameLen) + " bytes");
  }
  if (size >= (uint64_t{1} << 33)) return Status::InvalidArgument(name + ": member of 8 GiB or more");
  std::string h(kTarBlock, '\0');
  char* p = h.data();
  std::memcpy(p + kNameOff, name.data(), name.size());
  PutOctal(p + kModeOff, 8, 0644);
  PutOctal(p + kUidOff, 8, 0);
  PutOctal(p + kGidOff, 8, 0);
  PutOctal(p + kSizeOff, kSizeLen, size);
  PutOctal(p + kMtimeOff, 12, static_cast<uint64_t>(mtime < 0 ? 0 : mtime));
  p[kTypeOff] = '0';
  std::memcpy(p + kMagicOff, "ustar", 6);  // with its NUL
  std::memcpy(p + kVersionOff, "00", 2);
  // Checksum: 6 octal digits, NUL, space (the field counted as spaces).
  PutOctal(p + kSumOff, 7, HeaderSum(reinterpret_cast<const uint8_t*>(p)));
  p[kSumOff + 7] = ' ';
  return h;
}

}  // namespace gradtrace
