// The launch records of blocksparse's native ops, shared by the ops built into one library: the
// records themselves -- prepared kernel-library launches, registered from Python by add_record --
// live in linear.cpp; another op (conv.cpp) launches them by id through the two functions below.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

namespace blocksparse_native {

// An append-only table of records named by their index, read while other threads may append (a
// deque: a record's reference outlives later appends); records are never removed.
template <typename T>
class Registry {
 public:
  explicit Registry(const char *what) : what_(what) {}

  const T &get(int64_t id) {
    std::lock_guard<std::mutex> guard(lock_);
    TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(items_.size()), "blocksparse: unknown ", what_, " ", id);
    return items_[id];
  }

  int64_t add(T item) {
    std::lock_guard<std::mutex> guard(lock_);
    items_.push_back(std::move(item));
    return static_cast<int64_t>(items_.size()) - 1;
  }

 private:
  std::mutex lock_;
  std::deque<T> items_;
  const char *what_;
};

// Record `id` run on operands `a` (operand 0) and `b` (operand 1): its output allocated (shape and
// dtype of the record; zero-filled first, cast after, where the record says) and its launch made on
// the current stream of `a`'s device.  Errors name the record or the launch that failed.
at::Tensor launch(int64_t id, const at::Tensor &a, const at::Tensor &b);

// `t` itself where it is dense row-major and starts on a 16-byte boundary (what the records' specs
// assume), else such a copy.
at::Tensor aligned(const at::Tensor &t);

}  // namespace blocksparse_native
