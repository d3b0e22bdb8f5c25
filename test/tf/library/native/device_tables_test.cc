// DeviceTables (src/tf/device_tables.h) on the CPU: a stand-in context allocates host tensors and a
// stand-in bsk_upload copies and counts, so the cache's choices are visible.  Prints one line per
// check; exits 1 on the first failure.  Built and run by test_device_tables.py.
#include <cstdio>
#include <cstring>

#include "device_tables.h"

static int uploads = 0;

extern "C" int bsk_upload(uint64_t address, const void* source, size_t bytes, void* stream, char* message,
                          size_t size) {
  ++uploads;
  std::memcpy(reinterpret_cast<void*>(address), source, bytes);
  return BSK_OK;
}

namespace {

using tensorflow::Tensor;
using tensorflow::TensorShape;

struct HostContext {
  absl::Status allocate_temp(tensorflow::DataType type, const TensorShape& shape, Tensor* out) {
    *out = Tensor(type, shape);
    return absl::OkStatus();
  }
};

Tensor Table(int rows, int first) {
  Tensor t(tensorflow::DT_INT32, TensorShape({rows, 2}));
  auto flat = t.flat<int32_t>();
  for (int i = 0; i < flat.size(); ++i) flat(i) = first + i;
  return t;
}

bool Same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         !std::memcmp(a.tensor_data().data(), b.tensor_data().data(), a.tensor_data().size());
}

int failures = 0;

void Check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what);
  failures += !ok;
}

}  // namespace

int main() {
  blocksparse::DeviceTables tables;
  HostContext ctx;
  Tensor a = Table(3, 0), b = Table(3, 100), device_a, device_b, again;
  Check(tables.Get(&ctx, a, nullptr, &device_a).ok() && uploads == 1, "a new table is uploaded");
  Check(Same(device_a, a) && device_a.data() != a.data(), "the copy holds the table, in its own buffer");
  Check(tables.Get(&ctx, a, nullptr, &again).ok() && uploads == 1 && again.data() == device_a.data(),
        "the same host buffer finds its copy without an upload");
  Tensor a_copy = Table(3, 0);
  Check(tables.Get(&ctx, a_copy, nullptr, &again).ok() && uploads == 1 && again.data() == device_a.data(),
        "a new buffer with the same contents finds the copy by its contents");
  Check(tables.Get(&ctx, b, nullptr, &device_b).ok() && uploads == 2 && Same(device_b, b) &&
            device_b.data() != device_a.data(),
        "another layout's table of the same shape gets its own copy");
  Check(tables.Get(&ctx, a, nullptr, &again).ok() && again.data() == device_a.data() &&
            tables.Get(&ctx, b, nullptr, &again).ok() && again.data() == device_b.data() && uploads == 2,
        "alternating layouts keep their copies (no re-upload)");
  Tensor longer = Table(4, 0);
  Check(tables.Get(&ctx, longer, nullptr, &again).ok() && uploads == 3 && Same(again, longer),
        "a table that starts alike but is longer is another table");
  for (int i = 0; i < 10; ++i) {
    Tensor t = Table(2, 1000 + 10 * i), copy;
    tables.Get(&ctx, t, nullptr, &copy);
  }
  Check(tables.size() == blocksparse::DeviceTables::kMaxEntries, "the cache holds at most kMaxEntries tables");
  Check(Same(device_a, a), "a copy handed out stays valid after its entry is evicted");
  Check(tables.Get(&ctx, a, nullptr, &again).ok() && uploads == 14 && Same(again, a),
        "an evicted table is uploaded again when it returns");
  return failures ? 1 : 0;
}
