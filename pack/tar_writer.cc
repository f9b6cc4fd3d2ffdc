#include "tar_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "regular_file.h"

namespace gradtrace::pack {

Expected<std::unique_ptr<TarWriter>> TarWriter::Create(const std::string& path, const std::string& shown,
                                                       int64_t mtime) {
  std::unique_ptr<TarWriter> w(new TarWriter());
  w->shown_ = shown;
  w->mtime_ = mtime;
  w->file_ = std::fopen(path.c_str(), "wb");
  if (w->file_ == nullptr) return Status::IoError(shown + ": cannot create: " + std::strerror(errno));
  return w;
}

TarWriter::~TarWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status TarWriter::Write(const void* data, size_t n) {
  if (n > 0 && std::fwrite(data, 1, n, file_) != n) {
    return Status::IoError(shown_ + ": write failed: " + std::strerror(errno));
  }
  offset_ += n;
  return Status::Ok();
}

Status TarWriter::Header(const std::string& name, uint64_t size) {
  auto h = TarHeader(name, size, mtime_);
  if (!h.ok()) return Status::InvalidArgument(shown_ + ": " + h.status().message());
  GT_RETURN_IF_ERROR(Write(h->data(), h->size()));
  members_.push_back({name, offset_, size});
  return Status::Ok();
}

Status TarWriter::Add(const std::string& name, const std::string& content) {
  GT_RETURN_IF_ERROR(Header(name, content.size()));
  GT_RETURN_IF_ERROR(Write(content.data(), content.size()));
  static const char kZeros[kTarBlock] = {};
  return Write(kZeros, TarPadding(content.size()));
}

Status TarWriter::AddCopy(const std::string& name, const TraceSource& source,
                          const std::function<void(uint64_t)>& progress) {
  auto opened = OpenRegularFile(source.path, source.display());
  if (!opened.ok()) return opened.status();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(*opened, &std::fclose);
  struct stat st;
  if (fstat(fileno(in.get()), &st) != 0) {
    return Status::IoError(source.display() + ": cannot stat: " + std::strerror(errno));
  }
  const uint64_t real = static_cast<uint64_t>(st.st_size);
  if (source.offset > real) return Status::Truncated(source.display() + ": shorter than its window");
  const uint64_t size = source.size.value_or(real - source.offset);
  if (size > real - source.offset) return Status::Truncated(source.display() + ": shorter than its window");
  if (fseeko(in.get(), static_cast<off_t>(source.offset), SEEK_SET) != 0) {
    return Status::IoError(source.display() + ": seek failed: " + std::strerror(errno));
  }
  GT_RETURN_IF_ERROR(Header(name, size));
  std::string buf(4u << 20, '\0');
  for (uint64_t done = 0; done < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - done));
    if (std::fread(buf.data(), 1, n, in.get()) != n) {
      return Status::IoError(source.display() + ": read failed (file changed while packing?)");
    }
    GT_RETURN_IF_ERROR(Write(buf.data(), n));
    done += n;
    if (progress) progress(n);
  }
  static const char kZeros[kTarBlock] = {};
  return Write(kZeros, TarPadding(size));
}

Status TarWriter::Flush() {
  if (std::fflush(file_) != 0) return Status::IoError(shown_ + ": write failed: " + std::strerror(errno));
  return Status::Ok();
}

Status TarWriter::Finish() {
  static const char kZeros[2 * kTarBlock] = {};
  GT_RETURN_IF_ERROR(Write(kZeros, sizeof kZeros));
  GT_RETURN_IF_ERROR(Flush());
  if (::fsync(fileno(file_)) != 0) return Status::IoError(shown_ + ": fsync failed: " + std::strerror(errno));
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) return Status::IoError(shown_ + ": close failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace gradtrace::pack
