// merge_attention_states on CUDA tensors, in bf16, f16 and f32, against the
// host implementation (merge_attention_states on host copies of the same
// values): within a rounding of the dtype (the device's expf, logf and
// contracted multiply-adds round differently from the host's), with rows
// whose lse is -inf on one side or on both (o = 0, lse = -inf exactly),
// guard bytes around every output untouched, and in place over o_a, lse_a
// giving the same bits as into separate outputs.
#include "gpu_test_util.hpp"

#ifdef GQATTN_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "varlen_harness.hpp"

namespace gqattn::test {
namespace {

using varlen::decode;
using varlen::encode;
using varlen::GuardedBuffer;
using varlen::rounded;

constexpr int64_t B = 2, Tq = 5, H = 3, d = 72;  // d not a multiple of 32: the lanes' tail

struct States {
  std::vector<float> o_a, lse_a, o_b, lse_b;
};

// Random states; some rows -inf on side a, some on side b, some on both.
States make_states(DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> lse(-3.0f, 6.0f);
  States s;
  for (auto* o : {&s.o_a, &s.o_b}) {
    o->resize(std::size_t(B * Tq * H * d));
    for (float& x : *o) x = rounded(dtype, normal(rng));
  }
  for (auto* l : {&s.lse_a, &s.lse_b}) {
    l->resize(std::size_t(B * H * Tq));
    for (float& x : *l) x = lse(rng);
  }
  for (std::size_t r = 0; r < s.lse_a.size(); r += 4) s.lse_a[r] = -INFINITY;
  for (std::size_t r = 0; r < s.lse_b.size(); r += 3) s.lse_b[r] = -INFINITY;  // r % 12 == 0: both
  return s;
}

TensorRef o_ref(void* data, DType dtype, Device device) {
  return contiguous(data, dtype, device, B, Tq, H, d);
}
TensorRef lse_ref(void* data, Device device) {
  return contiguous(data, DType::f32, device, B, H, Tq);
}

struct Merged {
  std::vector<float> o, lse;
};

Merged merge_on_host(const States& s, DType dtype) {
  std::vector<unsigned char> oa = encode(dtype, s.o_a), ob = encode(dtype, s.o_b), o(oa.size());
  std::vector<float> la = s.lse_a, lb = s.lse_b, l(la.size());
  merge_attention_states(o_ref(oa.data(), dtype, Device::cpu), lse_ref(la.data(), Device::cpu),
                         o_ref(ob.data(), dtype, Device::cpu), lse_ref(lb.data(), Device::cpu),
                         o_ref(o.data(), dtype, Device::cpu), lse_ref(l.data(), Device::cpu));
  return {decode(dtype, o.data(), s.o_a.size()), l};
}

// Device inputs and outputs, each between poisoned guards.
struct DeviceStates {
  DType dtype;
  GuardedBuffer o_a, lse_a, o_b, lse_b, o, lse;
  DeviceStates(const States& s, DType t)
      : dtype(t),
        o_a(Device::cuda, s.o_a.size() * dtype_size(t)),
        lse_a(Device::cuda, s.lse_a.size() * 4),
        o_b(Device::cuda, s.o_b.size() * dtype_size(t)),
        lse_b(Device::cuda, s.lse_b.size() * 4),
        o(Device::cuda, s.o_a.size() * dtype_size(t)),
        lse(Device::cuda, s.lse_a.size() * 4) {
    o_a.upload(encode(t, s.o_a));
    o_b.upload(encode(t, s.o_b));
    lse_a.upload(encode(DType::f32, s.lse_a));
    lse_b.upload(encode(DType::f32, s.lse_b));
  }
  Merged read(GuardedBuffer& ob, GuardedBuffer& lb) {
    const std::size_t n = std::size_t(B * Tq * H * d), rows = std::size_t(B * H * Tq);
    const varlen::Output out_o = varlen::read_output(ob, n * dtype_size(dtype));
    const varlen::Output out_l = varlen::read_output(lb, rows * 4);
    EXPECT_TRUE(out_o.guards_intact) << "o: a guard byte was written";
    EXPECT_TRUE(out_l.guards_intact) << "lse: a guard byte was written";
    return {decode(dtype, out_o.bytes.data(), n), decode(DType::f32, out_l.bytes.data(), rows)};
  }
};

// The largest |x - ref| allowed: one rounding of the dtype at the outputs'
// magnitude (16-bit), or a few f32 ulps of it.
double allowed(DType dtype, double magnitude) {
  const double eps = dtype == DType::bf16 ? 0x1p-8 : dtype == DType::f16 ? 0x1p-11 : 0x1p-21;
  return eps * std::max(magnitude, 1.0);
}

void expect_close(const Merged& gpu, const Merged& host, DType dtype) {
  double o_max = 0.0, o_err = 0.0;
  for (std::size_t x = 0; x < host.o.size(); ++x) {
    ASSERT_FALSE(std::isnan(gpu.o[x])) << "o[" << x << "] is NaN (unwritten?)";
    o_max = std::max(o_max, std::fabs(double(host.o[x])));
    o_err = std::max(o_err, std::fabs(double(gpu.o[x]) - host.o[x]));
  }
  EXPECT_LE(o_err, allowed(dtype, o_max)) << "o";
  for (std::size_t r = 0; r < host.lse.size(); ++r) {
    if (std::isinf(host.lse[r])) {
      EXPECT_EQ(gpu.lse[r], host.lse[r]) << "lse row " << r;
      continue;
    }
    EXPECT_LE(std::fabs(double(gpu.lse[r]) - host.lse[r]),
              allowed(DType::f32, std::fabs(host.lse[r])))
        << "lse row " << r;
  }
}

class GpuMergeStates : public ::testing::TestWithParam<DType> {};

TEST_P(GpuMergeStates, AgreesWithTheHostMerge) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const DType dtype = GetParam();
  const States s = make_states(dtype, 7);
  DeviceStates dev(s, dtype);
  merge_attention_states(
      o_ref(dev.o_a.data(), dtype, Device::cuda), lse_ref(dev.lse_a.data(), Device::cuda),
      o_ref(dev.o_b.data(), dtype, Device::cuda), lse_ref(dev.lse_b.data(), Device::cuda),
      o_ref(dev.o.data(), dtype, Device::cuda), lse_ref(dev.lse.data(), Device::cuda));
  device_synchronize();
  const Merged gpu = dev.read(dev.o, dev.lse);
  const Merged host = merge_on_host(s, dtype);
  expect_close(gpu, host, dtype);

  // Rows with -inf on both sides: o = 0 and lse = -inf, exactly.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const std::size_t r = std::size_t((b * H + h) * Tq + i);
        if (s.lse_a[r] != -INFINITY || s.lse_b[r] != -INFINITY) continue;
        EXPECT_EQ(gpu.lse[r], -INFINITY) << "row " << r;
        for (int64_t x = 0; x < d; ++x)
          EXPECT_EQ(gpu.o[std::size_t(((b * Tq + i) * H + h) * d + x)], 0.0f) << "row " << r;
      }
}

TEST_P(GpuMergeStates, InPlaceOverOaGivesTheSameBits) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const DType dtype = GetParam();
  const States s = make_states(dtype, 11);
  DeviceStates dev(s, dtype);
  merge_attention_states(
      o_ref(dev.o_a.data(), dtype, Device::cuda), lse_ref(dev.lse_a.data(), Device::cuda),
      o_ref(dev.o_b.data(), dtype, Device::cuda), lse_ref(dev.lse_b.data(), Device::cuda),
      o_ref(dev.o.data(), dtype, Device::cuda), lse_ref(dev.lse.data(), Device::cuda));
  merge_attention_states(
      o_ref(dev.o_a.data(), dtype, Device::cuda), lse_ref(dev.lse_a.data(), Device::cuda),
      o_ref(dev.o_b.data(), dtype, Device::cuda), lse_ref(dev.lse_b.data(), Device::cuda),
      o_ref(dev.o_a.data(), dtype, Device::cuda), lse_ref(dev.lse_a.data(), Device::cuda));
  device_synchronize();
  const Merged separate = dev.read(dev.o, dev.lse);
  const Merged in_place = dev.read(dev.o_a, dev.lse_a);
  ASSERT_EQ(separate.o.size(), in_place.o.size());
  EXPECT_EQ(0, std::memcmp(separate.o.data(), in_place.o.data(), separate.o.size() * 4)) << "o";
  EXPECT_EQ(0, std::memcmp(separate.lse.data(), in_place.lse.data(), separate.lse.size() * 4))
      << "lse";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMergeStates,
                         ::testing::Values(DType::bf16, DType::f16, DType::f32),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(dtype_name(param.param));
                         });

}  // namespace
}  // namespace gqattn::test

#endif  // GQATTN_WITH_CUDA
