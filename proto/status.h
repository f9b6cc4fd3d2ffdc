// Status and Expected<T>: errors as values for everything that reads outside
// input. Exceptions never cross the codec boundary.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace gradtrace {

class Status {
 public:
  enum class Code { kOk, kIoError, kCorruption, kTruncated, kLimitExceeded, kInvalidArgument, kMismatch };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status IoError(std::string msg) { return Status(Code::kIoError, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status Truncated(std::string msg) { return Status(Code::kTruncated, std::move(msg)); }
  static Status LimitExceeded(std::string msg) { return Status(Code::kLimitExceeded, std::move(msg)); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status Mismatch(std::string msg) { return Status(Code::kMismatch, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  // One line, already naming the file and offset where the producer knew them.
  const std::string& message() const { return message_; }

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// A value or the Status saying why there is none.
template <typename T>
class Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}                                  // NOLINT: implicit by design
  Expected(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

#define GT_RETURN_IF_ERROR(expr)      \
  do {                                \
    ::gradtrace::Status _st = (expr); \
    if (!_st.ok()) return _st;        \
  } while (0)

}  // namespace gradtrace
