// libFuzzer target: a bug-report archive (archive.h) from a stranger. The
// input is the whole archive file: its member table is read, every trace
// member is read in place through a window (TraceReader), the manifest is
// parsed, and the archive's trace set is loaded as gradtrace-diff would. No
// crash, no read outside a member's window, and every error one line naming
// the archive.
#include <cstddef>
#include <cstdint>

#include "archive.h"
#include "format.h"
#include "fuzz_common.h"
#include "load/packed_run.h"
#include "load/trace_set.h"
#include "trace_reader.h"

using namespace gradtrace;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile* file = new fuzz::MemFile();
  file->Set(data, size);
  const std::string& path = file->path();
  auto archive = Archive::Open(path);
  if (!archive.ok()) {
    fuzz::CheckErrorLine(archive.status(), path);
    return 0;
  }
  if (archive->members().size() > kMaxArchiveMembers) fuzz::Fail("more members than kMaxArchiveMembers accepted");
  for (const ArchiveMember& m : archive->members()) {
    if (m.offset > size || m.size > size - m.offset) fuzz::Fail("member '" + m.name + "' outside the file");
    if (!BadMemberName(m.name).empty()) fuzz::Fail("member name accepted: " + m.name);
    if (m.name.size() >= 7 && m.name.compare(m.name.size() - 7, 7, ".gtrace") == 0) {
      const TraceSource source = TraceSource::Window(path, m.offset, m.size, archive->NameOf(m));
      auto r = TraceReader::Open(source);
      if (!r.ok()) {
        fuzz::CheckErrorLine(r.status(), archive->NameOf(m));
        continue;
      }
      if ((*r)->file_size() != m.size) fuzz::Fail("reader window is not the member's size");
      Frame f;
      while ((*r)->Next(&f)) {
        if (f.offset + format::kFrameHeaderSize + f.stored_len > m.size)
          fuzz::Fail("frame read past its member's window");
      }
      fuzz::CheckErrorLine((*r)->status(), archive->NameOf(m));
    } else if (m.size <= (1u << 20)) {
      auto text = archive->Read(m);
      if (text.ok() && text->size() != m.size) fuzz::Fail("member read returned the wrong size");
    }
  }
  if (auto packed = diff::ReadPackedDiff(path); !packed.ok()) fuzz::CheckErrorNaming(packed.status(), path);
  diff::LoadOptions lo;
  lo.threads = 1;
  if (auto set = diff::TraceSet::Load(path + ":a", lo); !set.ok()) fuzz::CheckErrorNaming(set.status(), path);
  return 0;
}
