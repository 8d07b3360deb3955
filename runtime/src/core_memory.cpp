#include "core_memory.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include <fmt/format.h>

#include "nikki/jit/native_args.hpp"

namespace nikki::runtime {

namespace {

std::atomic<size_t> g_live{0};

struct Pool {
  std::mutex mutex;
  std::vector<std::unique_ptr<CoreMemory>> idle;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: executors may outlive static destruction
  return *p;
}

std::unique_ptr<CoreMemory> allocate(size_t sbuf_bytes, size_t psum_bytes) {
  auto m = std::make_unique<CoreMemory>();
  m->sbuf_bytes = sbuf_bytes;
  m->psum_bytes = psum_bytes;
  // Not value-initialized: pages a run never touches are never made resident.
  m->sbuf = std::make_unique_for_overwrite<uint8_t[]>(sbuf_bytes);
  m->psum = std::make_unique_for_overwrite<uint8_t[]>(psum_bytes);
  m->psum_written = std::make_unique<uint8_t[]>(psum_bytes / 4);
  m->native_scratch = std::make_unique<float[]>(size_t(native::kScratchFloats));
  ++g_live;
  return m;
}

}  // namespace

CoreMemoryLease::CoreMemoryLease(size_t sbuf_bytes, size_t psum_bytes) {
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    auto it = std::find_if(p.idle.begin(), p.idle.end(), [&](const std::unique_ptr<CoreMemory>& m) {
      return m->sbuf_bytes == sbuf_bytes && m->psum_bytes == psum_bytes;
    });
    if (it != p.idle.end()) {
      memory_ = std::move(*it);
      p.idle.erase(it);
      return;
    }
  }
  memory_ = allocate(sbuf_bytes, psum_bytes);
}

CoreMemoryLease::~CoreMemoryLease() {
  Pool& p = pool();
  std::unique_ptr<CoreMemory> evicted;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.idle.push_back(std::move(memory_));
    if (p.idle.size() > kIdleCoreMemories) {
      evicted = std::move(p.idle.front());  // the longest idle
      p.idle.erase(p.idle.begin());
    }
  }
  if (evicted) --g_live;
}

size_t live_core_memories() { return g_live.load(); }

ZeroedMemory::ZeroedMemory(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw KernelError(fmt::format("the host cannot reserve {} of address space for the simulated memory",
                                  bytes_text(int64_t(bytes))),
                      {}, {}, "nikki reserves each simulated memory (SBUF, PSUM, HBM scratch) in host memory",
                      "use smaller scratch tensors");
  data_ = static_cast<uint8_t*>(p);
}

ZeroedMemory::ZeroedMemory(ZeroedMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

ZeroedMemory& ZeroedMemory::operator=(ZeroedMemory&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

ZeroedMemory::~ZeroedMemory() {
  if (data_) munmap(data_, size_);
}

}  // namespace nikki::runtime
