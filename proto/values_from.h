// Format 1.6's record by reference (FORMAT.md 4.3): a BucketRecord whose
// values_from names an earlier frame holding its values. What a reference must
// agree on with its target, in one place for every read path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gradtrace.pb.h"

namespace gradtrace {

// Why `target` cannot give `ref` its values, or "" when it can: the target is
// itself a reference, or the slices differ in number, param id, offset, count
// or dtype, or a slice of either is not `full`, or one of ref's holds data.
// `ref_data`: ref's slices' bytes as viewed (record_view.h), or null for the
// bytes in `ref` itself.
std::string ValuesFromMismatch(const pb::BucketRecord& ref, const std::vector<std::string_view>* ref_data,
                               const pb::BucketRecord& target);

// `ref` serialized deterministically without its values_from: the same bytes for
// references that differ only in where their targets are (replicas' references,
// each rank's file laying its frames out at offsets of its own).
std::string WithoutValuesFrom(const pb::BucketRecord& ref);

}  // namespace gradtrace
