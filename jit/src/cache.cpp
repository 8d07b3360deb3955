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

/** The fixed-size start of an entry file; the key's bytes and then the payload follow it. */
struct EntryHeader {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t key_size;
  uint64_t payload_size;
  Hash128 checksum;  // of the key's bytes and the payload
};
static_assert(sizeof(EntryHeader) == 48);

uint64_t mix(uint64_t x) {
  // splitmix64 finalizer: spreads every input bit over the output
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Hash128 entry_checksum(const std::vector<uint8_t>& key, const uint8_t* payload, size_t payload_size) {
  return Hasher().bytes(key.data(), key.size()).bytes(payload, payload_size).finish();
}

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

CacheKey& CacheKey::bytes(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  material_.insert(material_.end(), p, p + n);
  return *this;
}

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

const char* cache_lookup_name(CacheLookup lookup) {
  switch (lookup) {
    case CacheLookup::hit: return "hit";
    case CacheLookup::absent: return "absent";
    case CacheLookup::truncated: return "truncated";
    case CacheLookup::corrupt: return "corrupt";
    case CacheLookup::wrong_version: return "of another format version";
    case CacheLookup::wrong_key: return "of another key";
  }
  return "?";
}

bool log_enabled(std::string_view what) {
  const char* env = std::getenv("NIKKI_LOG");
  if (!env) return false;
  std::string_view v(env);
  return v == "all" || v.find(what) != std::string_view::npos;
}

void log_rejected_entry(const std::string& path, std::string_view reason) {
  if (log_enabled("cache"))
    std::fprintf(stderr, "nikki: cache entry %s is %.*s: rebuilding it\n", path.c_str(), int(reason.size()),
                 reason.data());
}

std::string DiskCache::path(std::string_view category, const Hash128& hash) const {
  return fmt::format("{}/{}/{}.bin", settings_.directory, category, hash.hex());
}

namespace {

/** An entry file's key bytes and payload, after the container's checks. */
struct EntryContents {
  CacheLookup lookup = CacheLookup::absent;
  std::vector<uint8_t> key, payload;
};

EntryContents read_entry(const std::string& file) {
  EntryContents entry;
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) return entry;
  const uint64_t file_size = uint64_t(in.tellg());
  EntryHeader header;
  entry.lookup = CacheLookup::truncated;
  if (file_size < sizeof(header)) return entry;
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(&header), sizeof(header))) return entry;
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) {
    entry.lookup = CacheLookup::corrupt;
    return entry;
  }
  if (header.version != DiskCache::kFormatVersion) {
    entry.lookup = CacheLookup::wrong_version;
    return entry;
  }
  if (header.key_size > file_size || header.payload_size != file_size - sizeof(header) - header.key_size) return entry;
  entry.key.resize(header.key_size);
  entry.payload.resize(header.payload_size);
  if (!in.read(reinterpret_cast<char*>(entry.key.data()), std::streamsize(entry.key.size())) ||
      !in.read(reinterpret_cast<char*>(entry.payload.data()), std::streamsize(entry.payload.size())))
    return entry;
  entry.lookup = entry_checksum(entry.key, entry.payload.data(), entry.payload.size()) == header.checksum
                     ? CacheLookup::hit
                     : CacheLookup::corrupt;
  return entry;
}

}  // namespace

std::optional<std::vector<uint8_t>> DiskCache::load(std::string_view category, const CacheKey& key,
                                                    CacheLookup* lookup) const {
  const std::string file = path(category, key);
  EntryContents entry;
  if (settings_.enabled) entry = read_entry(file);
  if (entry.lookup == CacheLookup::hit && entry.key != key.material()) entry.lookup = CacheLookup::wrong_key;
  if (entry.lookup != CacheLookup::hit && entry.lookup != CacheLookup::absent)
    log_rejected_entry(file, cache_lookup_name(entry.lookup));
  if (lookup) *lookup = entry.lookup;
  if (entry.lookup != CacheLookup::hit) return std::nullopt;
  return std::move(entry.payload);
}

std::optional<CacheKey> DiskCache::stored_key(std::string_view category, const Hash128& hash) const {
  EntryContents entry = read_entry(path(category, hash));
  if (entry.lookup != CacheLookup::hit) return std::nullopt;
  CacheKey key;
  key.bytes(entry.key.data(), entry.key.size());
  return key;
}

void DiskCache::store(std::string_view category, const CacheKey& key, const std::vector<uint8_t>& payload) const {
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
    EntryHeader header{};
    std::memcpy(header.magic, kMagic, sizeof(kMagic));
    header.version = kFormatVersion;
    header.key_size = key.material().size();
    header.payload_size = payload.size();
    header.checksum = entry_checksum(key.material(), payload.data(), payload.size());
    out.write(reinterpret_cast<const char*>(&header), sizeof(header));
    out.write(reinterpret_cast<const char*>(key.material().data()), std::streamsize(key.material().size()));
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
