#include "nikki/jit/compile.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/allocate.hpp"
#include "nikki/jit/verify.hpp"

namespace nikki::jit {

namespace {

bool log_enabled(std::string_view what) {
  const char* env = std::getenv("NIKKI_LOG");
  if (!env) return false;
  std::string_view v(env);
  return v == "all" || v.find(what) != std::string_view::npos;
}

/** Runs stages in order, timing each and dumping its artifact when NIKKI_DUMP is set. */
class StageRunner {
 public:
  StageRunner(Program& program) : program_(program) {
    if (const char* dir = std::getenv("NIKKI_DUMP"); dir && *dir) dump_dir_ = dir;
  }

  template <class F>
  void run(std::string_view name, F&& stage) {
    auto start = std::chrono::steady_clock::now();
    stage();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    program_.timings.push_back({std::string(name), ms});
    if (log_enabled("stages"))
      std::fprintf(stderr, "nikki: %s: stage %-10.*s %8.3f ms\n", program_.kernel.name.c_str(), int(name.size()),
                   name.data(), ms);
    if (!dump_dir_.empty()) dump(name);
  }

 private:
  void dump(std::string_view name) {
    std::filesystem::create_directories(dump_dir_);
    auto path = std::filesystem::path(dump_dir_) /
                fmt::format("{}.{}.{}.txt", program_.kernel.name, program_.timings.size(), name);
    std::ofstream(path) << to_string(program_.kernel);
  }

  Program& program_;
  std::string dump_dir_;
};

}  // namespace

Program compile(Kernel kernel) {
  Program program{std::move(kernel), {}};
  StageRunner stages(program);
  stages.run("verify", [&] { verify(program.kernel); });
  stages.run("allocate", [&] { allocate(program.kernel); });
  return program;
}

}  // namespace nikki::jit
