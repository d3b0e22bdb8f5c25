// Device copies of the ops' lookup tables: uploaded once per table and GPU, kept by the op kernel.
//
// The tables reach the GPU kernels in host memory (Const nodes of the graph, or host tensors the
// frontend keeps per layout in eager mode; the kernels are registered with HostMemory tables), so
// TensorFlow inserts no per-step host-to-device copy.  Each kernel instance (one per graph node and
// device; in eager mode one per op attrs and device, shared by layouts of equal sizes) keeps the
// device copies it made, found again by the host buffer (the same Const or eager tensor every
// step: a buffer this cache still references cannot have been reused for other contents) or, for
// a new buffer, by its contents.  A few tables per kernel at most; the oldest goes first.
#ifndef BLOCKSPARSE_TF_DEVICE_TABLES_H_
#define BLOCKSPARSE_TF_DEVICE_TABLES_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "bsk.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"

namespace blocksparse {

class DeviceTables {
 public:
  // Tables one kernel keeps: a layout's fprop, bprop or updat table, a few layouts in eager mode.
  static constexpr size_t kMaxEntries = 8;

  size_t size() {
    tensorflow::mutex_lock lock(mu_);
    return entries_.size();
  }

  // `*device`: the device copy of `host` (an int32 table in host memory), allocated by `ctx`
  // (an OpKernelContext: on the kernel's GPU) and uploaded on `stream` (a CUstream) the first time
  // this kernel sees these contents.
  template <typename Context>
  absl::Status Get(Context* ctx, const tensorflow::Tensor& host, void* stream, tensorflow::Tensor* device) {
    tensorflow::mutex_lock lock(mu_);
    for (const Entry& e : entries_) {  // every step but the first: no pass over the contents
      if (e.host.shape() == host.shape() && e.host.SharesBufferWith(host)) {
        *device = e.device;
        return absl::OkStatus();
      }
    }
    const uint64_t hash = Hash(host);
    for (Entry& e : entries_) {
      if (e.host.shape() == host.shape() && e.hash == hash &&
          !std::memcmp(e.host.tensor_data().data(), host.tensor_data().data(), host.tensor_data().size())) {
        e.host = host;  // the next step's lookup finds this buffer in the first pass
        *device = e.device;
        return absl::OkStatus();
      }
    }
    Entry e{host, tensorflow::Tensor(), hash};
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, host.shape(), &e.device));
    char message[1024] = {0};
    const int status = bsk_upload(reinterpret_cast<uint64_t>(e.device.data()), host.tensor_data().data(),
                                  host.tensor_data().size(), stream, message, sizeof(message));
    if (status != BSK_OK)
      return tensorflow::errors::Internal("uploading a lookup table to the GPU failed: ", message);
    if (entries_.size() == kMaxEntries) entries_.erase(entries_.begin());
    entries_.push_back(e);
    *device = e.device;
    return absl::OkStatus();
  }

 private:
  struct Entry {
    tensorflow::Tensor host;    // holds the host buffer: its address cannot be reused meanwhile
    tensorflow::Tensor device;  // the copy on the kernel's GPU
    uint64_t hash;              // of the contents
  };

  // FNV-1a over 64-bit words (tables are int32: a whole number of 4-byte words).
  static uint64_t Hash(const tensorflow::Tensor& t) {
    const absl::string_view bytes = t.tensor_data();
    uint64_t h = 1469598103934665603ull;
    size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, bytes.data() + i, 8);
      h = (h ^ word) * 1099511628211ull;
    }
    for (; i < bytes.size(); ++i) h = (h ^ static_cast<unsigned char>(bytes[i])) * 1099511628211ull;
    return h;
  }

  tensorflow::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace blocksparse

#endif  // BLOCKSPARSE_TF_DEVICE_TABLES_H_
