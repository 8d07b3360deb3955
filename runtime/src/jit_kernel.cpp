#include "nikki/runtime/jit_kernel.hpp"

#include <algorithm>

namespace nikki::runtime {

bool operator==(const Specialization& a, const Specialization& b) {
  auto same_spec = [](const TensorSpec& x, const TensorSpec& y) {
    return x.shape == y.shape && x.dtype == y.dtype && x.writable == y.writable;
  };
  return a.constants == b.constants && a.trace.target == b.trace.target && a.trace.grid.dims == b.trace.grid.dims &&
         a.trace.grid.program_ids == b.trace.grid.program_ids &&
         std::equal(a.inputs.begin(), a.inputs.end(), b.inputs.begin(), b.inputs.end(), same_spec);
}

size_t SpecializationHash::operator()(const Specialization& s) const noexcept {
  // splitmix64-style mixing of every integer in the key.
  uint64_t h = 0x9e3779b97f4a7c15ull ^ s.constants;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;
  };
  mix(static_cast<uint64_t>(s.trace.target));
  for (const TensorSpec& t : s.inputs) {
    mix(static_cast<uint64_t>(t.dtype) | (uint64_t(t.writable) << 8) | (uint64_t(t.shape.rank()) << 16));
    for (int i = 0; i < t.shape.rank(); ++i) mix(static_cast<uint64_t>(t.shape[i]));
  }
  for (int64_t d : s.trace.grid.dims) mix(static_cast<uint64_t>(d));
  for (int64_t d : s.trace.grid.program_ids) mix(static_cast<uint64_t>(d) ^ 0x5555);
  return static_cast<size_t>(h);
}

jit::CompileOptions JitKernel::default_options() {
  jit::CompileOptions o;
  o.native = executor_from_env() == ExecutorKind::native;
  return o;
}

JitKernel::JitKernel(std::string name, Body body, jit::CompileOptions options)
    : name_(std::move(name)),
      body_(std::move(body)),
      options_(options),
      kind_(options.native ? ExecutorKind::native : ExecutorKind::interp) {}

CompiledKernel& JitKernel::compiled(const Specialization& s) { return entry(s)->kernel; }

std::shared_ptr<JitKernel::Entry> JitKernel::entry(const Specialization& s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(s); it != cache_.end()) {
      uses_.splice(uses_.end(), uses_, it->second->use);
      return it->second;
    }
  }
  // Compile outside the lock: another thread may be compiling another specialization.
  Kernel kernel = trace_specs(s.trace, name_, s.inputs, body_);
  auto entry = std::make_shared<Entry>();
  entry->kernel.program = jit::compile(std::move(kernel), options_);
  const auto [order, seed] = stream_order_from_env();  // NIKKI_STREAM_ORDER, as for Python kernels
  entry->kernel.executor =
      std::make_unique<StreamExecutor>(entry->kernel.program.device, kind_, entry->kernel.program.native, order, seed);
  entry->bytes = sizeof(Entry) + jit::memory_bytes(entry->kernel.program) + entry->kernel.executor->resident_bytes();
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = cache_.try_emplace(s, entry);
  if (!inserted) return it->second;  // a concurrent compile of the same key: the first one wins
  entry->use = uses_.insert(uses_.end(), &it->first);
  bytes_ += entry->bytes;
  shrink_locked();
  return entry;
}

void JitKernel::shrink_locked() {
  // The most recently used entry stays: its caller is about to use it.
  while (bytes_ > limit_ && uses_.size() > 1) {
    auto it = cache_.find(*uses_.front());
    bytes_ -= it->second->bytes;
    uses_.pop_front();
    cache_.erase(it);  // a run in progress keeps its entry alive through its own reference
  }
}

void JitKernel::run(const Specialization& s, std::span<void* const> inputs, std::span<void* const> outputs) {
  std::shared_ptr<Entry> e = entry(s);
  std::lock_guard<std::mutex> running(e->running);
  e->kernel.executor->run(inputs, outputs);
}

size_t JitKernel::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

size_t JitKernel::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

size_t JitKernel::memory_limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

void JitKernel::set_memory_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
  shrink_locked();
}

}  // namespace nikki::runtime
