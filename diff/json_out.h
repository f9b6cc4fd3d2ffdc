// A minimal JSON emitter for reports: no dependency, non-finite numbers as null.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace gradtrace::diff {

class JsonOut {
 public:
  JsonOut& BeginObject() { return Open('{'); }
  JsonOut& EndObject() { return Close('}'); }
  JsonOut& BeginArray() { return Open('['); }
  JsonOut& EndArray() { return Close(']'); }
  JsonOut& Key(const std::string& k) {
    Comma();
    Quote(k);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  JsonOut& String(const std::string& s) {
    Comma();
    Quote(s);
    return *this;
  }
  JsonOut& Number(double v) {
    Comma();
    if (!std::isfinite(v)) {
      out_ += "null";
    } else {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%.17g", v);
      out_ += buf;
    }
    return *this;
  }
  JsonOut& Int(int64_t v) {
    Comma();
    out_ += std::to_string(v);
    return *this;
  }
  JsonOut& Bool(bool v) {
    Comma();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonOut& Null() {
    Comma();
    out_ += "null";
    return *this;
  }
  // Inserts already-serialized JSON (e.g. protobuf's JSON of a Config).
  JsonOut& Raw(const std::string& json) {
    Comma();
    out_ += json;
    return *this;
  }
  std::string Take() { return std::move(out_) + "\n"; }

  static std::string Escape(const std::string& s) {
    std::string o;
    for (unsigned char c : s) {
      switch (c) {
        case '"':
          o += "\\\"";
          break;
        case '\\':
          o += "\\\\";
          break;
        case '\n':
          o += "\\n";
          break;
        case '\r':
          o += "\\r";
          break;
        case '\t':
          o += "\\t";
          break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            o += buf;
          } else {
            o += static_cast<char>(c);
          }
      }
    }
    return o;
  }

 private:
  JsonOut& Open(char c) {
    Comma();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  JsonOut& Close(char c) {
    first_.pop_back();
    out_ += c;
    return *this;
  }
  void Comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ", ";
      first_.back() = false;
    }
  }
  void Quote(const std::string& s) { out_ += "\"" + Escape(s) + "\""; }

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace gradtrace::diff
