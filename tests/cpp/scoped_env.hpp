// An environment variable set for a scope and restored after it (tests and benchmarks switch
// NIKKI_* settings this way, so that a failure cannot leak a setting into what runs next), and a
// disk cache directory of the scope's own.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>

namespace nikki::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (previous_) ::setenv(name_, previous_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

/** Points NIKKI_CACHE_DIR at a fresh directory for the scope's lifetime. */
class TempCacheDir {
 public:
  TempCacheDir() : path_(fresh_path()), env_("NIKKI_CACHE_DIR", path_.string()) {}
  ~TempCacheDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static std::filesystem::path fresh_path() {
    static std::atomic<int> counter{0};
    std::filesystem::path p =
        std::filesystem::temp_directory_path() / fmt::format("nikki-cache-test-{}-{}", ::getpid(), counter++);
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p;
  }
  std::filesystem::path path_;
  ScopedEnv env_;
};

}  // namespace nikki::test
