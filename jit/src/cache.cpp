#include "nikki/jit/cache.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>

namespace nikki::jit {

namespace {

constexpr char kMagic[8] = {'N', 'I', 'K', 'C', 'A', 'C', 'H', 'E'};
constexpr size_t kHeader = 8 + 8 + 16;

uint64_t mix(uint64_t x) {
  // splitmix64 finalizer: spreads every input bit over the output
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Hash128 hash_bytes(const std::vector<uint8_t>& v) { return Hasher().bytes(v.data(), v.size()).finish(); }

}  // namespace

Hasher& Hasher::bytes(const void* data, size_t n) {
  // Eight bytes per step: keys hash whole serialized kernels and build_id() the compiler's binary,
  // so a byte-at-a-time loop was a visible part of a cache hit. Each step is a bijection of the
  // lane for a fixed input word (xor/add, odd multiply, rotate), so distinct words never collide
  // within a step.
  const auto* p = static_cast<const uint8_t*>(data);
  auto absorb = [this](uint64_t w) {
    a_ = std::rotl((a_ ^ w) * 0x9e3779b97f4a7c15ull, 27);
    b_ = std::rotl((b_ + w) * 0xc2b2ae3d27d4eb4full, 31) ^ a_;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    absorb(w);
  }
  if (i < n) {  // the tail, zero-padded, with its length in the top byte
    uint64_t w = 0;
    std::memcpy(&w, p + i, n - i);
    absorb(w ^ (uint64_t(n - i) << 56));
  }
  n_ += n;
  return *this;
}

Hash128 Hasher::finish() const { return {mix(a_ ^ mix(n_)), mix(b_ + 0x9e3779b97f4a7c15ull * (n_ + 1))}; }

std::string Hash128::hex() const { return fmt::format("{:016x}{:016x}", hi, lo); }

const Hash128& build_id() {
  static const Hash128 id = [] {
    Hasher h;
    h.str("nikki 0.1.0");
    Dl_info info{};
    // The shared object or executable that contains this function: the compiler's own code.
    if (dladdr(reinterpret_cast<void*>(&build_id), &info) && info.dli_fname) {
      std::ifstream in(info.dli_fname, std::ios::binary);
      std::vector<char> buffer(1 << 16);
      while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) h.bytes(buffer.data(), size_t(in.gcount()));
    }
    return h.finish();
  }();
  return id;
}

CacheSettings CacheSettings::from_env() {
  CacheSettings s;
  if (const char* dir = std::getenv("NIKKI_CACHE_DIR"); dir && *dir) s.directory = dir;
  else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) s.directory = std::string(xdg) + "/nikki";
  else if (const char* home = std::getenv("HOME"); home && *home) s.directory = std::string(home) + "/.cache/nikki";
  else s.enabled = false;
  if (const char* always = std::getenv("NIKKI_ALWAYS_COMPILE"); always && std::string_view(always) == "1")
    s.enabled = false;
  return s;
}

std::string DiskCache::path(std::string_view category, const Hash128& key) const {
  return fmt::format("{}/{}/{}.bin", settings_.directory, category, key.hex());
}

std::optional<std::vector<uint8_t>> DiskCache::load(std::string_view category, const Hash128& key) const {
  if (!settings_.enabled) return std::nullopt;
  std::ifstream in(path(category, key), std::ios::binary | std::ios::ate);
  if (!in) return std::nullopt;
  const std::streamoff file_size = in.tellg();
  if (file_size < std::streamoff(kHeader)) return std::nullopt;
  in.seekg(0);
  char header[kHeader];
  if (!in.read(header, kHeader) || std::memcmp(header, kMagic, 8) != 0) return std::nullopt;
  uint64_t size;
  Hash128 sum;
  std::memcpy(&size, header + 8, 8);
  std::memcpy(&sum.hi, header + 16, 8);
  std::memcpy(&sum.lo, header + 24, 8);
  if (uint64_t(file_size) - kHeader != size) return std::nullopt;  // truncated
  std::vector<uint8_t> payload(size);
  if (!in.read(reinterpret_cast<char*>(payload.data()), std::streamsize(size))) return std::nullopt;
  if (!(hash_bytes(payload) == sum)) return std::nullopt;  // corrupt
  return payload;
}

void DiskCache::store(std::string_view category, const Hash128& key, const std::vector<uint8_t>& payload) const {
  if (!settings_.enabled) return;
  namespace fs = std::filesystem;
  const fs::path target = path(category, key);
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) return;  // an unwritable cache only costs speed
  static std::atomic<uint64_t> counter{0};
  const fs::path temp = target.string() + fmt::format(".tmp.{}.{}", ::getpid(), counter++);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    const uint64_t size = payload.size();
    const Hash128 sum = hash_bytes(payload);
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(reinterpret_cast<const char*>(&sum.hi), 8);
    out.write(reinterpret_cast<const char*>(&sum.lo), 8);
    out.write(reinterpret_cast<const char*>(payload.data()), std::streamsize(payload.size()));
    if (!out) {
      out.close();
      fs::remove(temp, ec);
      return;
    }
  }
  fs::rename(temp, target, ec);  // atomic on POSIX: readers see the old entry or the new one
  if (ec) fs::remove(temp, ec);
}

}  // namespace nikki::jit
