#include "index_entry.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "format.h"

namespace gradtrace {

pb::IndexEntry StepEntry(const pb::StepInfo& step) {
  pb::IndexEntry e;
  e.set_step(step.step());
  e.set_micro_step(step.micro_step());
  return e;
}

pb::IndexEntry CatalogueEntry(const pb::BucketRecord& record) {
  pb::IndexEntry e;
  e.set_step(record.step());
  e.set_micro_step(record.micro_step());
  e.set_bucket_id(record.bucket_id());
  e.set_phase(record.phase());
  std::vector<int32_t> ids;
  ids.reserve(record.slices_size());
  for (const pb::Slice& s : record.slices()) ids.push_back(s.param_id());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  e.mutable_param_ids()->Add(ids.begin(), ids.end());
  e.set_group(record.group());
  e.set_bucket_numel(record.bucket_numel());
  e.set_partition_offset(record.partition_offset());
  e.set_partition_count(record.partition_count());
  e.set_divisor(record.divisor());
  return e;
}

namespace {

template <typename T>
std::string Differs(const char* field, const T& listed, const T& actual) {
  return std::string(field) + " " + std::to_string(listed) + " vs " + std::to_string(actual);
}

}  // namespace

std::string EntryMismatch(const pb::IndexEntry& l, const pb::IndexEntry& a, uint16_t minor) {
  if (l.offset() != a.offset()) return Differs("offset", l.offset(), a.offset());
  if (l.type() != a.type()) return Differs("type", l.type(), a.type());
  if (l.step() != a.step()) return Differs("step", l.step(), a.step());
  if (l.micro_step() != a.micro_step()) return Differs("micro_step", l.micro_step(), a.micro_step());
  if (l.bucket_id() != a.bucket_id()) return Differs("bucket_id", l.bucket_id(), a.bucket_id());
  if (l.phase() != a.phase()) return Differs("phase", static_cast<int>(l.phase()), static_cast<int>(a.phase()));
  if (minor < format::kMinorCataloguedIndex) return "";
  if (!std::equal(l.param_ids().begin(), l.param_ids().end(), a.param_ids().begin(), a.param_ids().end())) {
    return "param ids (" + std::to_string(l.param_ids_size()) + " vs " + std::to_string(a.param_ids_size()) + " ids)";
  }
  if (l.group() != a.group()) return "group '" + l.group() + "' vs '" + a.group() + "'";
  if (l.raw_len() != a.raw_len()) return Differs("raw_len", l.raw_len(), a.raw_len());
  if (l.bucket_numel() != a.bucket_numel()) return Differs("bucket_numel", l.bucket_numel(), a.bucket_numel());
  if (l.partition_offset() != a.partition_offset()) {
    return Differs("partition_offset", l.partition_offset(), a.partition_offset());
  }
  if (l.partition_count() != a.partition_count()) {
    return Differs("partition_count", l.partition_count(), a.partition_count());
  }
  // Bitwise: both are copies of one double.
  const double ld = l.divisor(), ad = a.divisor();
  if (std::memcmp(&ld, &ad, sizeof(double)) != 0) return Differs("divisor", ld, ad);
  return "";
}

}  // namespace gradtrace
