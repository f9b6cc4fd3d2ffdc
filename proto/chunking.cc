#include "chunking.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "slice_codec.h"

namespace gradtrace {
namespace {

// Upper bound on what a slice costs inside a BucketRecord beyond its payload
// bytes: field tags and length varints of Slice and its payload message.
constexpr size_t kSliceOverhead = 64;
// An encoded sketch entry: a packed int64 position (<= 10 bytes) and a double.
constexpr size_t kSketchUnitBytes = 18;

// One input slice viewed as a sequence of cuttable units: elements for full
// slices, positions for sketch slices; other slices are a single unit.
struct Source {
  const pb::Slice* slice;
  int64_t units;
  size_t unit_bytes;  // upper bound per unit; 0: not cuttable

  // Slice covering units [u0, u1).
  pb::Slice Piece(int64_t u0, int64_t u1) const {
    const pb::Slice& s = *slice;
    if (unit_bytes == 0 || (u0 == 0 && u1 == units)) return s;
    pb::Slice p;
    p.set_param_id(s.param_id());
    p.set_dtype(s.dtype());
    if (s.has_full()) {
      const size_t w = DTypeSize(s.dtype());
      p.set_offset(s.offset() + u0);
      p.set_count(u1 - u0);
      pb::FullPayload* f = p.mutable_full();
      f->set_shuffled(s.full().shuffled());
      const std::string& data = s.full().data();
      std::string* out = f->mutable_data();
      if (s.full().shuffled()) {
        // Byte plane j of the piece is bytes [u0, u1) of the slice's plane j:
        // cut each plane, no unshuffle and reshuffle.
        const size_t n = data.size() / w, m = static_cast<size_t>(u1 - u0);
        out->reserve(m * w);
        for (size_t j = 0; j < w; ++j) out->append(data, j * n + static_cast<size_t>(u0), m);
      } else {
        out->assign(data, static_cast<size_t>(u0) * w, static_cast<size_t>(u1 - u0) * w);
      }
    } else {
      const pb::SketchPayload& sk = s.sketch();
      // Cut element ranges at positions so the pieces tile the slice's range.
      const int64_t begin = u0 == 0 ? s.offset() : sk.positions(u0);
      const int64_t end = u1 == units ? s.offset() + s.count() : sk.positions(u1);
      p.set_offset(begin);
      p.set_count(end - begin);
      pb::SketchPayload* o = p.mutable_sketch();
      o->set_k(sk.k());
      for (int64_t u = u0; u < u1; ++u) {
        o->add_positions(sk.positions(u));
        o->add_values(sk.values(u));
      }
    }
    return p;
  }
};

Expected<Source> MakeSource(const pb::Slice& s) {
  Source src{&s, 1, 0};
  if (s.has_full()) {
    const size_t w = DTypeSize(s.dtype());
    if (w == 0 || s.count() < 0 || s.full().data().size() != static_cast<size_t>(s.count()) * w) {
      Expected<std::string> raw = DecodeFullBytes(s);  // names the problem
      return Status::InvalidArgument(raw.ok() ? "full slice payload size mismatch" : raw.status().message());
    }
    src.units = s.count();
    src.unit_bytes = DTypeSize(s.dtype());
  } else if (s.has_sketch() && s.sketch().positions_size() == s.sketch().values_size()) {
    src.units = s.sketch().positions_size();
    src.unit_bytes = kSketchUnitBytes;
  }
  if (src.units <= 1) src.unit_bytes = 0;
  return src;
}

// The size of `header` (no slices) in any chunk: its chunk fields at their widest varints.
size_t WidestHeaderBytes(const pb::BucketRecord& header) {
  pb::BucketRecord widest = header;
  widest.set_chunk(-1);
  widest.set_chunk_count(-1);
  widest.set_last_slice_continues(true);
  return widest.ByteSizeLong();
}

}  // namespace

Expected<std::vector<pb::BucketRecord>> SplitRecord(const pb::BucketRecord& record, size_t target) {
  if (record.ByteSizeLong() <= target) return std::vector<pb::BucketRecord>{record};
  pb::BucketRecord header = record;
  header.clear_slices();
  const size_t header_bytes = WidestHeaderBytes(header);
  if (header_bytes + kSliceOverhead >= target) return Status::InvalidArgument("chunk target too small");
  const size_t budget = target - header_bytes;

  std::vector<pb::BucketRecord> chunks;
  pb::BucketRecord cur = header;
  size_t used = 0;
  auto flush = [&](bool continues) {
    cur.set_last_slice_continues(continues);
    chunks.push_back(std::move(cur));
    cur = header;
    used = 0;
  };
  for (const pb::Slice& s : record.slices()) {
    Expected<Source> src = MakeSource(s);
    if (!src.ok()) return src.status();
    int64_t u = 0;
    while (u < src->units || (u == 0 && src->units == 0)) {
      const size_t avail = budget - used;
      const size_t whole = src->unit_bytes == 0 ? s.ByteSizeLong() + kSliceOverhead
                                                : kSliceOverhead + (src->units - u) * src->unit_bytes;
      if (whole <= avail) {
        *cur.add_slices() = src->Piece(u, src->units);
        used += whole;
        break;
      }
      const int64_t fit = src->unit_bytes == 0 || avail <= kSliceOverhead
                              ? 0
                              : static_cast<int64_t>((avail - kSliceOverhead) / src->unit_bytes);
      if (fit >= 1) {
        *cur.add_slices() = src->Piece(u, u + fit);
        u += fit;
        flush(/*continues=*/true);
        continue;
      }
      if (used == 0) {
        return Status::InvalidArgument("slice of param " + std::to_string(s.param_id()) + " (" +
                                       std::to_string(s.ByteSizeLong()) + " bytes) cannot be cut to fit " +
                                       std::to_string(target) + " bytes");
      }
      flush(/*continues=*/false);
    }
  }
  if (used > 0 || chunks.empty()) flush(false);
  const int n = static_cast<int>(chunks.size());
  for (int i = 0; i < n; ++i) {
    chunks[i].set_chunk(i);
    chunks[i].set_chunk_count(n);
    assert(chunks[i].ByteSizeLong() <= target);  // the unit and overhead bounds above are upper bounds
  }
  return chunks;
}

namespace {

// Joins pieces[0..n) of one cut slice, in order, into one slice; each piece is
// joined once, so the cost is linear in the slice's size.
Expected<pb::Slice> JoinPieces(std::vector<pb::Slice>& pieces) {
  if (pieces.size() == 1) return std::move(pieces[0]);
  pb::Slice out = std::move(pieces[0]);
  const int64_t begin = out.offset();
  int64_t end = out.offset() + out.count();
  for (size_t i = 1; i < pieces.size(); ++i) {
    const pb::Slice& next = pieces[i];
    if (next.param_id() != out.param_id() || next.dtype() != out.dtype() || next.payload_case() != out.payload_case() ||
        next.offset() != end || (out.has_full() && next.full().shuffled() != out.full().shuffled())) {
      return Status::Corruption("continued slice does not join: param " + std::to_string(out.param_id()) +
                                " ends at element " + std::to_string(end) + ", next piece is param " +
                                std::to_string(next.param_id()) + " [" + std::to_string(next.offset()) + ", +" +
                                std::to_string(next.count()) + ")");
    }
    end += next.count();
  }
  if (out.has_full()) {
    std::string raw;
    for (size_t i = 0; i < pieces.size(); ++i) {
      Expected<std::string> b = DecodeFullBytes(i == 0 ? out : pieces[i]);
      if (!b.ok()) return b.status();
      raw += b.value();
    }
    std::string* data = out.mutable_full()->mutable_data();
    if (out.full().shuffled()) {
      const size_t w = DTypeSize(out.dtype());
      data->resize(raw.size());
      ByteShuffle(reinterpret_cast<const uint8_t*>(raw.data()), raw.size() / w, w,
                  reinterpret_cast<uint8_t*>(data->data()));
    } else {
      *data = std::move(raw);
    }
  } else if (out.has_sketch()) {
    for (size_t i = 1; i < pieces.size(); ++i) {
      out.mutable_sketch()->mutable_positions()->MergeFrom(pieces[i].sketch().positions());
      out.mutable_sketch()->mutable_values()->MergeFrom(pieces[i].sketch().values());
    }
  } else if (pieces.size() > 1) {
    return Status::Corruption("continued slice has no cuttable payload");
  }
  out.set_offset(begin);
  out.set_count(end - begin);
  return out;
}

}  // namespace

Expected<pb::BucketRecord> MergeChunks(std::vector<pb::BucketRecord> chunks) {
  if (chunks.empty()) return Status::InvalidArgument("no chunks to merge");
  if (chunks.size() == 1 && chunks[0].chunk_count() <= 1) return std::move(chunks[0]);
  std::sort(chunks.begin(), chunks.end(), [](const auto& a, const auto& b) { return a.chunk() < b.chunk(); });
  const int n = static_cast<int>(chunks.size());
  for (int i = 0; i < n; ++i) {
    const pb::BucketRecord& c = chunks[i];
    if (c.chunk() != i || c.chunk_count() != n || c.step() != chunks[0].step() ||
        c.micro_step() != chunks[0].micro_step() || c.bucket_id() != chunks[0].bucket_id() ||
        c.phase() != chunks[0].phase()) {
      return Status::Corruption("chunk set of bucket " + std::to_string(chunks[0].bucket_id()) + " step " +
                                std::to_string(chunks[0].step()) + " is incomplete or inconsistent at chunk " +
                                std::to_string(c.chunk()) + " of " + std::to_string(c.chunk_count()) + " (have " +
                                std::to_string(n) + ")");
    }
  }
  if (chunks[n - 1].last_slice_continues()) return Status::Corruption("last chunk says its slice continues");
  pb::BucketRecord out = chunks[0];
  out.clear_slices();
  std::vector<pb::Slice> pieces;  // the slice being joined, when it continues
  for (int i = 0; i < n; ++i) {
    pb::BucketRecord& c = chunks[i];
    for (int j = 0; j < c.slices_size(); ++j) {
      pieces.push_back(std::move(*c.mutable_slices(j)));
      const bool continues = c.last_slice_continues() && j == c.slices_size() - 1;
      if (continues) continue;
      Expected<pb::Slice> joined = JoinPieces(pieces);
      if (!joined.ok()) return joined.status();
      *out.add_slices() = std::move(joined.value());
      pieces.clear();
    }
  }
  if (!pieces.empty()) return Status::Corruption("continued slice is missing its next piece");
  out.set_chunk(0);
  out.set_chunk_count(0);
  out.set_last_slice_continues(false);
  return out;
}

}  // namespace gradtrace
