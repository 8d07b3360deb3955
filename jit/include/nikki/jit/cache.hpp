// The on-disk compile cache: content-addressed files under NIKKI_CACHE_DIR, written atomically,
// checked on read. Keys hash everything that determines the artifact: the canonical content, the
// target, the options and the identity of the nikki build that produced it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nikki::jit {

/** @brief A 128-bit content hash (not cryptographic; collisions are astronomically unlikely for cache keys). */
struct Hash128 {
  uint64_t hi = 0, lo = 0;
  /** @brief 32 hex digits. */
  std::string hex() const;
  friend bool operator==(const Hash128&, const Hash128&) = default;
};

/** @brief Incremental hashing of bytes, strings and integers. */
class Hasher {
 public:
  Hasher& bytes(const void* data, size_t n);
  Hasher& str(std::string_view s) {
    u64(s.size());
    return bytes(s.data(), s.size());
  }
  Hasher& u64(uint64_t v) { return bytes(&v, sizeof(v)); }
  Hash128 finish() const;

 private:
  uint64_t a_ = 0xcbf29ce484222325ull;  // arbitrary distinct seeds of the two lanes
  uint64_t b_ = 0x84222325cbf29ce4ull;
  uint64_t n_ = 0;
};

/** @brief Identity of this nikki build: a hash of the binary that contains the compiler, so any
 * rebuild with changed code invalidates cached artifacts. Computed once per process. */
const Hash128& build_id();

/** @brief Cache settings from the environment: NIKKI_CACHE_DIR (default $XDG_CACHE_HOME/nikki or
 * ~/.cache/nikki) and NIKKI_ALWAYS_COMPILE=1 (neither read nor write the cache). */
struct CacheSettings {
  std::string directory;
  bool enabled = true;
  static CacheSettings from_env();
};

/**
 * @brief Reads and writes cache entries. A file is `<dir>/<category>/<key>.bin` holding a header
 * (magic, size, checksum) and the payload. Writes go to a temporary file renamed into place, so
 * readers never see a partial entry and concurrent writers of one key both succeed. A truncated
 * or corrupt entry reads as a miss (and is overwritten by the next store).
 */
class DiskCache {
 public:
  explicit DiskCache(CacheSettings settings = CacheSettings::from_env()) : settings_(std::move(settings)) {}
  bool enabled() const { return settings_.enabled; }
  std::optional<std::vector<uint8_t>> load(std::string_view category, const Hash128& key) const;
  void store(std::string_view category, const Hash128& key, const std::vector<uint8_t>& payload) const;
  /** @brief Path of an entry (for tests and diagnostics). */
  std::string path(std::string_view category, const Hash128& key) const;

 private:
  CacheSettings settings_;
};

}  // namespace nikki::jit
