// On-chip buffers of the library kernels: multi-buffered rings, arenas of variable-width spans,
// and the budget that sizes them against the target's SBUF and PSUM.
//
// A ring or arena is one tensor carved into slots. Reusing a slot needs no bookkeeping: the task
// scheduler (toolkit/task_scheduler.hpp) derives from the slot's memory that its new occupant's
// first writer waits for every task that used the previous one. The depth of a ring is thus how
// far ahead work may run ("issue n - 1 tiles ahead"), and the budget decides the depths.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/nikki.hpp"

namespace nikki::kernels::toolkit {

/** @brief Tiles handed out in turn from a fixed set of slots (a tile multi-buffered n deep). */
class Ring {
 public:
  Ring() = default;
  /** @brief The slots of `storage` along `dim` (each slot drops that dim). */
  Ring(const Tensor& storage, int64_t dim = 1) {
    for (int64_t s = 0; s < storage.shape()[size_t(dim)]; ++s) slots_.push_back(storage.select(dim, s));
  }
  /** @brief The given views, in turn. */
  explicit Ring(std::vector<Tensor> slots) : slots_(std::move(slots)) {}

  /** @brief An SBUF ring: `slots` tiles of `tile` ([partitions, ...]) in one tensor. */
  static Ring sbuf(const Shape& tile, DType dtype, int64_t slots, const std::string& name, Loc loc = Loc::current()) {
    return Ring(nl::ndarray(with_slots(tile, slots), dtype, nl::sbuf, name, std::nullopt, loc), 1);
  }

  /**
   * @brief A PSUM ring of accumulator tiles: each slot lies within one bank (a matmul accumulates
   * within a bank), as many to a bank as fit. `tile` is [partitions, free] with free bytes at
   * most a bank.
   */
  static Ring psum(const Shape& tile, DType dtype, int64_t slots, const std::string& name, Loc loc = Loc::current()) {
    const nl::TileSize ts = nl::tile_size();
    const int64_t bank_elems = ts.psum_bank_fmax_bytes / dtype_size(dtype);
    const int64_t free = tile.num_elements() / tile[0];
    internal_check(free <= bank_elems, "psum ring: a slot is larger than a PSUM bank");
    const int64_t per_bank = bank_elems / free, banks = (slots + per_bank - 1) / per_bank;
    Tensor t = nl::ndarray({tile[0], banks, bank_elems}, dtype, nl::psum, name, std::nullopt, loc);
    std::vector<Tensor> views;
    for (int64_t s = 0; s < slots; ++s) {
      Tensor v = t(nl::all, s / per_bank, nl::ds((s % per_bank) * free, free));
      views.push_back(tile.rank() == 2 ? v : v.reshape(tile));
    }
    return Ring(std::move(views));
  }

  /** @brief The next slot's tile. */
  Tensor next() {
    internal_check(!slots_.empty(), "ring: no slots");
    return slots_[size_t(next_++ % int64_t(slots_.size()))];
  }
  int64_t slots() const { return int64_t(slots_.size()); }
  /** @brief Slot `i` (for buffers addressed by index rather than in turn). */
  const Tensor& slot(int64_t i) const { return slots_.at(size_t(i)); }

 private:
  static Shape with_slots(const Shape& tile, int64_t slots) {
    std::vector<int64_t> dims{tile[0], slots};
    for (int d = 1; d < tile.rank(); ++d) dims.push_back(tile[d]);
    return Shape(dims);
  }
  std::vector<Tensor> slots_;
  int64_t next_ = 0;
};

/**
 * @brief Spans of varying width along dim 1 of one tensor, allocated circularly: many narrow
 * work items or a few wide ones are in flight (key chunks of different lengths, say).
 */
class Arena {
 public:
  Arena() = default;
  explicit Arena(Tensor storage) : t_(std::move(storage)), size_(t_.shape()[1]) {}

  /** @brief The next span of `width` along dim 1 (wrapping to the start when it does not fit). */
  Tensor next(int64_t width) {
    internal_check(width >= 1 && width <= size_, "arena: span wider than the arena");
    if (head_ + width > size_) head_ = 0;
    Tensor span = t_.slice(1, head_, head_ + width);
    head_ += width;
    return span;
  }
  int64_t size() const { return size_; }

 private:
  Tensor t_;
  int64_t size_ = 0, head_ = 0;
};

/**
 * @brief The on-chip memory a kernel plans to use, per partition, against the target's SBUF and
 * PSUM. Kernels size their tiles and ring depths with it (fits(), largest()), then reserve what
 * they allocate; a plan that does not fit is a KernelError at the kernel's call that names what
 * was reserved, the capacity and a fix.
 */
class Budget {
 public:
  explicit Budget(const ArgumentCheck& check)
      : check_(check), sbuf_capacity_(nl::tile_size().sbuf_fmax_bytes), psum_banks_(nl::tile_size().psum_num_banks) {}

  int64_t sbuf_capacity() const { return sbuf_capacity_; }
  int64_t sbuf_used() const { return sbuf_used_; }
  int64_t sbuf_free() const { return sbuf_capacity_ - sbuf_used_; }
  int64_t psum_banks_free() const { return psum_banks_ - psum_used_; }

  /** @brief Whether `bytes` more per partition fit in SBUF. */
  bool fits(int64_t bytes) const { return bytes <= sbuf_free(); }

  /** @brief The first of `candidates` (tried in order) whose footprint fits, or nullopt. */
  template <class Footprint>
  std::optional<int64_t> largest(std::initializer_list<int64_t> candidates, Footprint&& footprint) const {
    for (int64_t c : candidates)
      if (fits(footprint(c))) return c;
    return std::nullopt;
  }

  /** @brief Records `bytes` per partition of SBUF for `what`; a KernelError when they do not fit. */
  void reserve_sbuf(int64_t bytes, const std::string& what, const std::string& hint = {}) {
    if (!fits(bytes))
      check_.fail(what + " does not fit in SBUF: " + kib(bytes) + " per partition needed, " + kib(sbuf_free()) +
                      " free of " + kib(sbuf_capacity_),
                  "SBUF holds " + kib(sbuf_capacity_) + " per partition", hint);
    sbuf_used_ += bytes;
  }
  /** @brief Records `banks` PSUM banks for `what`. */
  void reserve_psum(int64_t banks, const std::string& what) {
    if (banks > psum_banks_free())
      throw InternalError("budget: the kernel's PSUM plan needs more banks than the target has (" + what + ")",
                          std::source_location::current());
    psum_used_ += banks;
  }

  /** @brief An SBUF ring reserved in the budget. */
  Ring sbuf_ring(const Shape& tile, DType dtype, int64_t slots, const std::string& name, Loc loc = Loc::current()) {
    reserve_sbuf(slots * tile.num_elements() / tile[0] * dtype_size(dtype), name);
    return Ring::sbuf(tile, dtype, slots, name, loc);
  }
  /** @brief An SBUF tensor reserved in the budget. */
  Tensor sbuf(const Shape& shape, DType dtype, const std::string& name, Loc loc = Loc::current()) {
    reserve_sbuf(shape.num_elements() / shape[0] * dtype_size(dtype), name);
    return nl::ndarray(shape, dtype, nl::sbuf, name, std::nullopt, loc);
  }
  /** @brief A PSUM ring reserved in the budget (whole banks). */
  Ring psum_ring(const Shape& tile, DType dtype, int64_t slots, const std::string& name, Loc loc = Loc::current()) {
    reserve_psum(psum_banks(tile, dtype, slots), name);
    return Ring::psum(tile, dtype, slots, name, loc);
  }
  /** @brief PSUM banks `slots` tiles take when no tile crosses a bank (see Ring::psum). */
  static int64_t psum_banks(const Shape& tile, DType dtype, int64_t slots) {
    const int64_t per_bank = nl::tile_size().psum_bank_fmax_bytes / (tile.num_elements() / tile[0] * dtype_size(dtype));
    return (slots + per_bank - 1) / per_bank;
  }

 private:
  static std::string kib(int64_t bytes) { return std::to_string((bytes + 1023) / 1024) + " KiB"; }

  const ArgumentCheck& check_;
  int64_t sbuf_capacity_, psum_banks_;
  int64_t sbuf_used_ = 0, psum_used_ = 0;
};

}  // namespace nikki::kernels::toolkit
