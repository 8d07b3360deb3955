// The two compile caches: the disk cache of device programs (keys, corrupt and truncated entries,
// concurrent writers in two processes) and JitKernel's in-memory cache of specializations.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include "harness.hpp"
#include "scoped_env.hpp"
#include "nikki/runtime/jit_kernel.hpp"

namespace nikki::test {
namespace {

namespace fs = std::filesystem;

// out = a * scale + b over a [rows, cols] tile; `op` and `scale` vary the IR.
Kernel axpb(Shape shape, DType dtype, TargetId target = TargetId::trn2, nl::Op op = nl::add, double scale = 2.0) {
  return trace(TraceOptions{.target = target}, "axpb",
               [&](const Tensor& a, const Tensor& b) {
                 Tensor out = nl::ndarray(shape, dtype, nl::shared_hbm, "out");
                 Tensor ta = nl::ndarray(shape, nl::float32, nl::sbuf, "ta");
                 Tensor tb = nl::ndarray(shape, nl::float32, nl::sbuf, "tb");
                 isa::dma_copy(ta, a);
                 isa::dma_copy(tb, b);
                 Tensor r = nl::ndarray(shape, dtype, nl::sbuf, "r");
                 isa::scalar_tensor_tensor(r, ta, nl::multiply, scale, op, tb);
                 isa::dma_copy(out, r);
                 return out;
               },
               spec(shape, dtype, "a"), spec(shape, dtype, "b"));
}

// An entry file: a 48-byte header (magic, u32 format version, u32 reserved, u64 key size, u64
// payload size, 128-bit checksum), the key's bytes, the payload.
constexpr std::streamoff kEntryHeaderBytes = 48;
constexpr std::streamoff kEntryVersionOffset = 8;

void flip_byte(const fs::path& path, std::uintmax_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char byte = char(f.get());
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(char(byte ^ 0xff));  // always a different byte
}

void set_format_version(const fs::path& path, uint32_t version) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(kEntryVersionOffset);
  f.write(reinterpret_cast<const char*>(&version), sizeof(version));
}

/** The hash an entry file is named by. */
jit::Hash128 hash_of_entry(const fs::path& entry) {
  const std::string hex = entry.stem().string();
  return {std::stoull(hex.substr(0, 16), nullptr, 16), std::stoull(hex.substr(16, 16), nullptr, 16)};
}

/** The entries of a cache category, by file name. */
std::set<fs::path> entries_of(const fs::path& dir, const std::string& category) {
  std::set<fs::path> out;
  if (fs::exists(dir / category))
    for (const auto& e : fs::directory_iterator(dir / category)) out.insert(e.path());
  return out;
}

bool has_stage(const jit::Program& p, const std::string& stage) {
  for (const jit::StageTiming& t : p.timings)
    if (t.stage == stage) return true;
  return false;
}

// Runs a compiled axpb on fixed inputs and checks a*2+b exactly (fp32, exact for these values).
void check_axpb_result(const jit::Program& p) {
  HostTensor a(DType::float32, {128, 64}), b(DType::float32, {128, 64}), out(DType::float32, {128, 64});
  for (int64_t i = 0; i < a.size(); ++i) {
    a.set(i, float(i % 7));
    b.set(i, float(i % 5));
  }
  void* ins[] = {a.data(), b.data()};
  void* outs[] = {out.data()};
  runtime::StreamExecutor(p.device, p.native ? runtime::ExecutorKind::native : runtime::ExecutorKind::interp,
                          p.native)
      .run(ins, outs);
  for (int64_t i = 0; i < out.size(); ++i) REQUIRE(out.get(i) == float(i % 7) * 2 + float(i % 5));
}

TEST_CASE("compile cache: the program key covers IR, shapes, dtypes, target, options and the build") {
  const jit::Hash128 build = jit::build_id();
  const Shape s{128, 64};
  auto key = [&](const Kernel& k, jit::CompileOptions o = {}, jit::Hash128 b = jit::build_id()) {
    return jit::program_cache_key(k, o, b).hash();
  };
  const jit::Hash128 base = key(axpb(s, DType::float32));
  CHECK(key(axpb(s, DType::float32)) == base);  // deterministic
  std::set<std::string> keys{base.hex()};
  keys.insert(key(axpb({128, 65}, DType::float32)).hex());
  keys.insert(key(axpb(s, DType::bfloat16)).hex());
  keys.insert(key(axpb(s, DType::float32, TargetId::trn1)).hex());
  keys.insert(key(axpb(s, DType::float32, TargetId::trn2, nl::subtract)).hex());
  keys.insert(key(axpb(s, DType::float32, TargetId::trn2, nl::add, 3.0)).hex());
  jit::CompileOptions dropped;
  dropped.schedule_options.drop_dependency = 0;
  keys.insert(key(axpb(s, DType::float32), dropped).hex());
  jit::CompileOptions squeezed;
  squeezed.allocate_options.sbuf_budget = 1024;
  keys.insert(key(axpb(s, DType::float32), squeezed).hex());
  jit::Hash128 other_build = build;
  other_build.lo ^= 1;
  keys.insert(key(axpb(s, DType::float32), {}, other_build).hex());
  CHECK(keys.size() == 9);
}

TEST_CASE("compile cache: a second compile is a disk hit that skips verify, allocate and schedule") {
  TempCacheDir dir;
  jit::Program first = jit::compile(axpb({128, 64}, DType::float32));
  CHECK(has_stage(first, "schedule"));
  jit::Program second = jit::compile(axpb({128, 64}, DType::float32));
  CHECK(has_stage(second, "cache"));
  CHECK_FALSE(has_stage(second, "verify"));
  CHECK_FALSE(has_stage(second, "schedule"));
  check_axpb_result(second);
  CHECK(jit::disassemble(*first.device) == jit::disassemble(*second.device));
}

TEST_CASE("compile cache: a disk hit keeps the spills and their warning") {
  TempCacheDir dir;
  // Three 16 KiB tiles summed into the first, in 40 KiB of SBUF: one must wait in HBM.
  auto kernel = [] {
    return trace("three", [](const Tensor& x) {
      Tensor out = nl::ndarray({128, 4096}, nl::float32, nl::shared_hbm, "out");
      std::vector<Tensor> ts;
      for (int i = 0; i < 3; ++i) {
        ts.push_back(nl::ndarray({128, 4096}, nl::float32, nl::sbuf, fmt::format("t{}", i)));
        isa::dma_copy(ts.back(), x);
        isa::tensor_scalar(ts.back(), ts.back(), nl::multiply, double(i + 1));
      }
      for (int i = 1; i < 3; ++i) isa::tensor_tensor(ts[0], ts[0], ts[i], nl::add);
      isa::dma_copy(out, ts[0]);
      return out;
    }, spec({128, 4096}, nl::float32, "x"));
  };
  jit::CompileOptions squeezed;
  squeezed.allocate_options.sbuf_budget = 40 * 1024;
  jit::Program first = jit::compile(kernel(), squeezed);
  REQUIRE_FALSE(first.spills.empty());
  REQUIRE(first.diagnostics.size() == 1);
  jit::Program second = jit::compile(kernel(), squeezed);
  CHECK(has_stage(second, "cache"));
  CHECK_FALSE(has_stage(second, "allocate"));
  CHECK(second.spills == first.spills);
  CHECK(second.device->spills == first.spills);
  REQUIRE(second.diagnostics.size() == 1);
  CHECK(second.diagnostics[0].message == first.diagnostics[0].message);
  CHECK(second.diagnostics[0].where == first.diagnostics[0].where);
  // The device-program file keeps them too.
  CHECK(jit::deserialize(jit::serialize(*first.device)).spills == first.spills);
}

TEST_CASE("compile cache: NIKKI_ALWAYS_COMPILE=1 neither reads nor writes the cache") {
  TempCacheDir dir;
  jit::Program q;
  {
    ScopedEnv always("NIKKI_ALWAYS_COMPILE", "1");
    jit::Program p = jit::compile(axpb({128, 64}, DType::float32));
    q = jit::compile(axpb({128, 64}, DType::float32));
  }
  CHECK(has_stage(q, "schedule"));
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("compile cache: truncated, corrupt and foreign entries are rebuilt, never trusted") {
  TempCacheDir dir;
  Kernel k = axpb({128, 64}, DType::float32);
  const jit::CacheKey key = jit::program_cache_key(k, {}, jit::build_id());
  const std::string path = jit::DiskCache().path("program", key);
  jit::compile(k);
  REQUIRE(fs::exists(path));
  const auto full_size = fs::file_size(path);

  SUBCASE("truncated") { fs::resize_file(path, full_size / 2); }
  SUBCASE("empty") { fs::resize_file(path, 0); }
  SUBCASE("corrupt payload byte") { flip_byte(path, full_size - 10); }
  SUBCASE("corrupt key byte") { flip_byte(path, kEntryHeaderBytes + 3); }
  SUBCASE("another format version") { set_format_version(path, jit::DiskCache::kFormatVersion + 1); }
  SUBCASE("valid checksum, not a device program") {
    jit::DiskCache().store("program", key, std::vector<uint8_t>(100, 0xab));
  }
  SUBCASE("another program's entry under this name") {
    Kernel other = axpb({128, 64}, DType::float32, TargetId::trn2, nl::subtract);
    jit::compile(other);
    fs::copy_file(jit::DiskCache().path("program", jit::program_cache_key(other, {}, jit::build_id())), path,
                  fs::copy_options::overwrite_existing);
  }
  jit::Program rebuilt = jit::compile(k);
  CHECK(has_stage(rebuilt, "schedule"));  // the entry was not used
  check_axpb_result(rebuilt);
  CHECK(fs::file_size(path) == full_size);  // and was rewritten
  jit::Program hit = jit::compile(k);
  CHECK_FALSE(has_stage(hit, "schedule"));
}

jit::CompileOptions native_options() {
  jit::CompileOptions o;
  o.native = true;
  return o;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TEST_CASE("compile cache: a native disk hit loads the instruction plan and runs the same routines") {
  TempCacheDir dir;
  Kernel k = axpb({128, 64}, DType::float32);
  const jit::CacheKey key = jit::program_cache_key(k, native_options(), jit::build_id());
  const std::string plan_path = jit::DiskCache().path("native-plan", key);
  jit::Program first = jit::compile(k, native_options());
  REQUIRE(fs::exists(plan_path));
  const std::vector<uint8_t> plan = file_bytes(plan_path);

  SUBCASE("intact") {}
  SUBCASE("valid checksum, not a plan") { jit::DiskCache().store("native-plan", key, std::vector<uint8_t>(64, 0x5a)); }
  SUBCASE("another program's plan") {
    // Structurally valid for this kernel (same instruction count), so only its stamp tells.
    Kernel other = axpb({128, 64}, DType::float32, TargetId::trn2, nl::subtract);
    jit::compile(other, native_options());
    const jit::CacheKey other_key = jit::program_cache_key(other, native_options(), jit::build_id());
    fs::copy_file(jit::DiskCache().path("native-plan", other_key), plan_path, fs::copy_options::overwrite_existing);
  }
  jit::Program hit = jit::compile(k, native_options());
  CHECK_FALSE(has_stage(hit, "schedule"));
  REQUIRE(hit.native);
  CHECK(hit.native->stats().instructions == first.native->stats().instructions);
  CHECK(hit.native->stats().templates == first.native->stats().templates);
  CHECK(hit.native->stats().fallbacks == first.native->stats().fallbacks);
  check_axpb_result(hit);
  CHECK(file_bytes(plan_path) == plan);  // a rejected plan was derived again and rewritten
}

TEST_CASE("compile cache: a loaded plan binds runtime offsets to the loaded program's views") {
  TempCacheDir dir;
  // out = table[k : k + 4, :], with k read from a 1x1 input at run time.
  auto gather = [] {
    return trace("gather_rows",
                 [](const Tensor& table, const Tensor& start) {
                   Tensor out = nl::ndarray({4, 64}, nl::float32, nl::shared_hbm, "out");
                   Tensor k = nl::ndarray({1, 1}, nl::int32, nl::sbuf, "k");
                   isa::dma_copy(k, start);
                   Tensor rows = nl::ndarray({4, 64}, nl::float32, nl::sbuf, "rows");
                   isa::dma_copy(rows, table.ap({{64, 4}, {1, 64}}, ApOptions{.scalar_offset_tensor = k}));
                   isa::dma_copy(out, rows);
                   return out;
                 },
                 spec({16, 64}, DType::float32, "table"), spec({1, 1}, DType::int32, "start"));
  };
  jit::compile(gather(), native_options());
  jit::Program hit = jit::compile(gather(), native_options());
  REQUIRE_FALSE(has_stage(hit, "schedule"));
  const Kernel& kernel = hit.kernel();
  bool native_runtime_offset = false;
  for (uint32_t i = 0; i < kernel.instructions.size(); ++i)
    if (const jit::NativeInstruction* n = hit.native->instruction(i))
      for (int slot = 0; slot < kMaxSlots; ++slot)
        if (n->operands[slot].indirection) {
          CHECK(n->operands[slot].indirection == kernel.indirection(kernel.instructions[i].operands[slot]));
          native_runtime_offset = true;
        }
  REQUIRE(native_runtime_offset);
  HostTensor table(DType::float32, {16, 64}), start(DType::int32, {1, 1}), out(DType::float32, {4, 64});
  for (int64_t i = 0; i < table.size(); ++i) table.set(i, float(i));
  for (int64_t k : {0, 5, 12}) {
    start.set(0, float(k));
    void* ins[] = {table.data(), start.data()};
    void* outs[] = {out.data()};
    runtime::StreamExecutor(hit.device, runtime::ExecutorKind::native, hit.native).run(ins, outs);
    for (int64_t i = 0; i < out.size(); ++i) REQUIRE(out.get(i) == float(k * 64 + i));
  }
}

TEST_CASE("compile cache: native code compiled on several threads is stored per template, reloaded, and rebuilt where damaged") {
  TempCacheDir dir;
  ScopedEnv threads("NIKKI_COMPILE_THREADS", "3");
  Kernel k = axpb({128, 64}, DType::float32);
  int64_t templates = 0;
  {
    jit::Program first = jit::compile(k, native_options());
    templates = first.native->stats().templates;
    CHECK(first.native->stats().origin == jit::CodeOrigin::compiled);
    CHECK(first.native->stats().compiled == templates);
    check_axpb_result(first);
    jit::Program shared = jit::compile(k, native_options());  // while the first is alive
    CHECK(shared.native->stats().origin == jit::CodeOrigin::in_memory);
    CHECK(shared.native->stats().compiled == 0);
  }  // the last user of the loaded code is gone: the next compile reads the disk cache
  REQUIRE(templates >= 3);  // so that each thread has a template of its own
  const std::set<fs::path> entries = entries_of(dir.path(), "native");
  REQUIRE(entries.size() == size_t(templates));  // one entry per template
  jit::CodeOrigin expected = jit::CodeOrigin::disk_cache;
  int64_t recompiled = 0;
  SUBCASE("reloaded") {}
  SUBCASE("a payload that is not object code is compiled again, alone") {
    std::optional<jit::CacheKey> key = jit::DiskCache().stored_key("native", hash_of_entry(*entries.begin()));
    REQUIRE(key);
    jit::DiskCache().store("native", *key, std::vector<uint8_t>(40, 0x07));
    expected = jit::CodeOrigin::compiled;
    recompiled = 1;
  }
  jit::Program again = jit::compile(k, native_options());
  CHECK(again.native->stats().templates == templates);
  CHECK(again.native->stats().origin == expected);
  CHECK(again.native->stats().compiled == recompiled);
  CHECK(entries_of(dir.path(), "native") == entries);
  check_axpb_result(again);
}

TEST_CASE("compile cache: a damaged or foreign native entry is compiled again and rewritten") {
  TempCacheDir dir;
  // Two kernels whose native code differs in one template (their operators do).
  Kernel k = axpb({128, 64}, DType::float32);
  Kernel other = axpb({128, 64}, DType::float32, TargetId::trn2, nl::subtract);
  jit::compile(k, native_options());  // the programs and their loaded code go at once
  const std::set<fs::path> before = entries_of(dir.path(), "native");
  REQUIRE(!before.empty());
  const fs::path entry = *before.begin();
  jit::Program shares = jit::compile(other, native_options());
  CHECK(shares.native->stats().compiled == 1);  // the other templates are k's
  shares = {};
  std::set<fs::path> after = entries_of(dir.path(), "native");
  for (const fs::path& p : before) after.erase(p);
  REQUIRE(after.size() == 1);
  const fs::path other_entry = *after.begin();
  const auto full_size = fs::file_size(entry);

  SUBCASE("another kernel's entry copied over it") {
    fs::copy_file(other_entry, entry, fs::copy_options::overwrite_existing);
  }
  SUBCASE("truncated") { fs::resize_file(entry, full_size - 7); }
  SUBCASE("a flipped byte") { flip_byte(entry, full_size / 2); }
  SUBCASE("another format version") { set_format_version(entry, jit::DiskCache::kFormatVersion - 1); }
  SUBCASE("the right key with object code that lacks its routines") {
    // What a build with a colliding id would leave: intact, keyed right, not this code.
    const jit::DiskCache cache;
    std::optional<jit::CacheKey> key = cache.stored_key("native", hash_of_entry(entry));
    std::optional<jit::CacheKey> other_key = cache.stored_key("native", hash_of_entry(other_entry));
    REQUIRE(key);
    REQUIRE(other_key);
    std::optional<std::vector<uint8_t>> other_code = cache.load("native", *other_key);
    REQUIRE(other_code);
    cache.store("native", *key, *other_code);
  }
  jit::Program rebuilt = jit::compile(k, native_options());
  CHECK(rebuilt.native->stats().origin == jit::CodeOrigin::compiled);
  CHECK(rebuilt.native->stats().compiled == 1);
  check_axpb_result(rebuilt);
  rebuilt = {};
  // The entry was rewritten: the next process (here: the next compile, with nothing loaded) uses it.
  jit::Program again = jit::compile(k, native_options());
  CHECK(again.native->stats().origin == jit::CodeOrigin::disk_cache);
  check_axpb_result(again);
}

TEST_CASE("compile cache: two processes compiling the same kernel at once both succeed") {
  TempCacheDir dir;
  int go[2];
  REQUIRE(::pipe(go) == 0);
  pid_t children[2];
  for (pid_t& child : children) {
    child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // Wait for the parent's signal so both compile at the same moment.
      char c;
      ::close(go[1]);
      int code = ::read(go[0], &c, 1) == 1 ? 0 : 3;
      try {
        jit::CompileOptions o;
        o.native = true;
        jit::Program p = jit::compile(axpb({128, 96}, DType::float32), o);
        code = p.device && p.native ? code : 4;
      } catch (...) {
        code = 5;
      }
      ::_exit(code);
    }
  }
  ::close(go[0]);
  const char start[2] = {'g', 'g'};
  REQUIRE(::write(go[1], start, 2) == 2);
  ::close(go[1]);
  for (pid_t child : children) {
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // The entry they wrote is whole and usable.
  jit::Program hit = jit::compile(axpb({128, 96}, DType::float32));
  CHECK_FALSE(has_stage(hit, "schedule"));
  for (const auto& entry : fs::recursive_directory_iterator(dir.path()))
    CHECK_MESSAGE(entry.path().extension() != ".tmp", "a temporary file was left behind: " << entry.path());
}

TEST_CASE("JitKernel: one compile per specialization, then memory hits") {
  TempCacheDir dir;
  int traces = 0;
  runtime::JitKernel k("scale", [&](const std::vector<Tensor>& in) {
    ++traces;
    const Tensor& x = in[0];
    Tensor out = nl::ndarray(x.shape(), x.dtype(), nl::shared_hbm, "out");
    Tensor t = nl::ndarray(x.shape(), nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, x);
    Tensor r = nl::ndarray(x.shape(), x.dtype(), nl::sbuf, "r");
    isa::tensor_scalar(r, t, nl::multiply, 3.0);
    isa::dma_copy(out, r);
    return std::vector<Tensor>{out};
  });
  runtime::Specialization s{{spec({64, 32}, DType::float32)}, {}, 0};
  const jit::Program* first = &k.program(s);
  CHECK(&k.program(s) == first);
  CHECK(&k.program(runtime::Specialization{{spec({64, 32}, DType::float32, "renamed")}, {}, 0}) == first);
  CHECK(traces == 1);
  k.program({{spec({64, 33}, DType::float32)}, {}, 0});
  k.program({{spec({64, 32}, DType::bfloat16)}, {}, 0});
  k.program({{spec({64, 32}, DType::float32)}, {.target = TargetId::trn1}, 0});
  k.program({{spec({64, 32}, DType::float32)}, {}, 7});
  CHECK(traces == 5);
  CHECK(k.size() == 5);

  HostTensor x = random_tensor(DType::float32, {64, 32}, 3);
  HostTensor out(DType::float32, {64, 32});
  void* ins[] = {x.data()};
  void* outs[] = {out.data()};
  k.run(s, ins, outs);
  for (int64_t i = 0; i < x.size(); ++i) REQUIRE(out.get(i) == x.get(i) * 3.0f);
  CHECK(traces == 5);
}

TEST_CASE("JitKernel: past its memory limit the least recently used specialization is compiled again") {
  TempCacheDir dir;
  int traces = 0;
  runtime::JitKernel k("triple", [&](const std::vector<Tensor>& in) {
    ++traces;
    Tensor out = nl::ndarray(in[0].shape(), in[0].dtype(), nl::shared_hbm, "out");
    Tensor t = nl::ndarray(in[0].shape(), nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, in[0]);
    isa::tensor_scalar(t, t, nl::multiply, 3.0);
    isa::dma_copy(out, t);
    return std::vector<Tensor>{out};
  });
  CHECK(k.memory_limit() == runtime::JitKernel::kDefaultMemoryLimit);
  auto run = [&](int64_t cols) {
    HostTensor x = random_tensor(DType::float32, {64, cols}, uint32_t(cols));
    HostTensor out(DType::float32, {64, cols});
    void* ins[] = {x.data()};
    void* outs[] = {out.data()};
    k.run({{spec({64, cols}, DType::float32)}, {}, 0}, ins, outs);
    for (int64_t i = 0; i < x.size(); ++i) REQUIRE(out.get(i) == x.get(i) * 3.0f);  // exact in fp32
  };
  run(16);
  run(24);
  CHECK(k.size() == 2);
  const size_t both = k.memory_bytes();
  // Room for one of these two programs of about equal size, not for both: the least recently used
  // (16) goes. (A program loaded from the disk cache is a little smaller: fewer stage timings.)
  k.set_memory_limit(both * 3 / 4);
  CHECK(k.size() == 1);
  CHECK(k.memory_bytes() < both);
  run(24);
  CHECK(traces == 2);
  run(16);  // compiled again (from the disk cache), and 24 goes
  CHECK(traces == 3);
  CHECK(k.size() == 1);
  k.set_memory_limit(0);  // the most recently used stays
  CHECK(k.size() == 1);
  run(16);
  CHECK(traces == 3);
}

TEST_CASE("JitKernel: concurrent runs of one specialization from two threads") {
  runtime::JitKernel k("negate", [](const std::vector<Tensor>& in) {
    Tensor out = nl::ndarray(in[0].shape(), in[0].dtype(), nl::shared_hbm, "out");
    Tensor t = nl::ndarray(in[0].shape(), nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, in[0]);
    isa::tensor_scalar(t, t, nl::multiply, -1.0);
    isa::dma_copy(out, t);
    return std::vector<Tensor>{out};
  });
  runtime::Specialization s{{spec({128, 256}, DType::float32)}, {}, 0};
  std::atomic<int> failures{0};
  auto worker = [&](uint32_t seed) {
    for (int iter = 0; iter < 20; ++iter) {
      HostTensor x = random_tensor(DType::float32, {128, 256}, seed + iter);
      HostTensor out(DType::float32, {128, 256});
      void* ins[] = {x.data()};
      void* outs[] = {out.data()};
      k.run(s, ins, outs);
      for (int64_t i = 0; i < x.size(); ++i) failures += out.get(i) != -x.get(i);
    }
  };
  std::thread a(worker, 100), b(worker, 200);
  a.join();
  b.join();
  CHECK(failures == 0);
  CHECK(k.size() == 1);
}

}  // namespace
}  // namespace nikki::test
