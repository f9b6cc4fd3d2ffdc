// The words of --self: an effective divisor of a group of parameters, against what their recorded layout
// needs (semantics::ExplainDivisor picks the rule; the sentences are here, with every other sentence of the
// diff in explain/).
#pragma once

#include <string>

#include "gradtrace.pb.h"
#include "report/report.h"

namespace gradtrace::diff {

// Words for an effective divisor `d` of a reduction over `p.group_size` ranks of `count` of `total`
// parameters of one kind (`p`: the group's middle parameter); fills `g`'s cause fields.
std::string ExplainDivisor(double d, int count, int total, const SelfParam& p, const pb::Config& c, bool deepspeed,
                           double ctol, Group* g);

}  // namespace gradtrace::diff
