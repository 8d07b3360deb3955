// Fixed-width little-endian encoding shared by nikki's binary files (the device program file and
// the native plan the cache keeps beside it): a Writer appends fields, a Reader checks every
// read against the bytes left and reports a damaged file as KernelError.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "nikki/error.hpp"

namespace nikki::jit {

class Writer {
 public:
  template <class T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void u8(uint64_t v) { pod<uint8_t>(static_cast<uint8_t>(v)); }
  void u16(uint64_t v) { pod<uint16_t>(static_cast<uint16_t>(v)); }
  void u32(uint64_t v) { pod<uint32_t>(static_cast<uint32_t>(v)); }
  void i32(int64_t v) { pod<int32_t>(static_cast<int32_t>(v)); }
  void i64(int64_t v) { pod<int64_t>(v); }
  void f64(double v) { pod<double>(v); }
  void str(std::string_view s) {
    u32(s.size());
    bytes(s.data(), s.size());
  }
  void bytes(const void* data, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, data, n);
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  uint8_t u8() { return pod<uint8_t>(); }
  uint16_t u16() { return pod<uint16_t>(); }
  uint32_t u32() { return pod<uint32_t>(); }
  int32_t i32() { return pod<int32_t>(); }
  int64_t i64() { return pod<int64_t>(); }
  double f64() { return pod<double>(); }
  std::string str() {
    uint32_t n = u32();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  /** @brief `n` raw bytes into `out`. */
  void bytes(void* out, size_t n) {
    need(n);
    std::memcpy(out, p_, n);
    p_ += n;
  }
  /** A count of items each at least `min_item_bytes` long, checked against the bytes left. */
  uint32_t count(size_t min_item_bytes) {
    uint32_t n = u32();
    if (min_item_bytes && n > size_t(end_ - p_) / min_item_bytes) corrupt("a count exceeds the file size");
    return n;
  }
  template <class E>
  E enumeration(int limit) {
    uint8_t v = u8();
    if (v >= limit) corrupt("an enum value is out of range");
    return static_cast<E>(v);
  }
  bool done() const { return p_ == end_; }
  [[noreturn]] static void corrupt(const std::string& why) {
    throw KernelError(fmt::format("device program file is corrupt: {}", why), {}, {}, {},
                      "recompile the kernel (cached files are rebuilt automatically)");
  }

 private:
  void need(size_t n) {
    if (size_t(end_ - p_) < n) corrupt("it ends early (truncated)");
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace nikki::jit
