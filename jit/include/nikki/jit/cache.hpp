// The on-disk compile cache: content-addressed files under NIKKI_CACHE_DIR, written atomically,
// checked on read. Keys hold everything that determines the artifact: the canonical content, the
// target, the options and the identity of the nikki build that produced it; files are named by
// the key's hash and carry the whole key, which a read compares.
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

/** @brief Strings (length-prefixed) and integers as bytes, for a class that takes bytes. */
template <class Sink>
class ByteInput {
 public:
  Sink& str(std::string_view s) {
    u64(s.size());
    return self().bytes(s.data(), s.size());
  }
  Sink& u64(uint64_t v) { return self().bytes(&v, sizeof(v)); }

 private:
  Sink& self() { return static_cast<Sink&>(*this); }
};

/** @brief Incremental hashing of bytes, strings and integers. */
class Hasher : public ByteInput<Hasher> {
 public:
  Hasher& bytes(const void* data, size_t n);
  Hash128 finish() const;

 private:
  uint64_t a_ = 0xcbf29ce484222325ull;  // arbitrary distinct seeds of the two lanes
  uint64_t b_ = 0x84222325cbf29ce4ull;
  uint64_t n_ = 0;
};

/**
 * @brief The key of a cache entry: the bytes of everything that determines the artifact, and
 * their hash, which names the entry's file. An entry stores these bytes and a load compares them,
 * so a file copied or renamed under another entry's name is never taken for that entry.
 */
class CacheKey : public ByteInput<CacheKey> {
 public:
  CacheKey& bytes(const void* data, size_t n);

  /** @brief Everything the key was built from, in order. */
  const std::vector<uint8_t>& material() const { return material_; }
  /** @brief The hash of material() (the entry's file name). */
  Hash128 hash() const { return Hasher().bytes(material_.data(), material_.size()).finish(); }

 private:
  std::vector<uint8_t> material_;
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

/** @brief What a cache look-up found. */
enum class CacheLookup : uint8_t {
  hit,
  absent,         // no entry (or the cache is off)
  truncated,      // shorter or longer than its header says
  corrupt,        // the checksum does not match
  wrong_version,  // written by another entry format
  wrong_key,      // an entry of another key under this key's name
};

/** @brief "hit", "absent", "truncated", "corrupt", "of another format version", "of another key". */
const char* cache_lookup_name(CacheLookup lookup);

/**
 * @brief Reads and writes cache entries. A file is `<dir>/<category>/<key hash>.bin` holding a
 * header (magic, format version, sizes, checksum), the key's bytes and the payload. Writes go to
 * a temporary file renamed into place, so readers never see a partial entry and concurrent
 * writers of one key both succeed. An entry that is truncated, corrupt, of another format version
 * or of another key reads as a miss (logged with NIKKI_LOG=cache) and is overwritten by the next
 * store.
 */
class DiskCache {
 public:
  /** @brief The entry format; entries of other versions are misses. */
  static constexpr uint32_t kFormatVersion = 2;

  explicit DiskCache(CacheSettings settings = CacheSettings::from_env()) : settings_(std::move(settings)) {}
  bool enabled() const { return settings_.enabled; }
  /** @brief The payload of `key`'s entry, or nullopt (with the reason in `lookup` when given). */
  std::optional<std::vector<uint8_t>> load(std::string_view category, const CacheKey& key,
                                           CacheLookup* lookup = nullptr) const;
  void store(std::string_view category, const CacheKey& key, const std::vector<uint8_t>& payload) const;
  /** @brief Path of an entry (for tests and diagnostics). */
  std::string path(std::string_view category, const CacheKey& key) const { return path(category, key.hash()); }
  std::string path(std::string_view category, const Hash128& hash) const;
  /** @brief The key stored in the entry named `hash`, when it is an intact entry of this format
   * (for tests and diagnostics: it is not checked against the name). */
  std::optional<CacheKey> stored_key(std::string_view category, const Hash128& hash) const;

 private:
  CacheSettings settings_;
};

/** @brief With NIKKI_LOG=cache (or all): says on stderr that the entry at `path` was not used
 * and why, and that it is being rebuilt. */
void log_rejected_entry(const std::string& path, std::string_view reason);

/** @brief True when NIKKI_LOG is `all` or contains `what` (e.g. "stages", "cache"). */
bool log_enabled(std::string_view what);

}  // namespace nikki::jit
