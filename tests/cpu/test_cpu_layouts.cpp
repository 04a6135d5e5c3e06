// Strides through the public API: tensors in a transposed, padded layout
// (no stride equal to its packed value) give bitwise the results of packed
// tensors, in every dtype, and nothing is written outside a view.
#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

TEST(CpuLayouts, StridedEqualsPackedBitwise) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Problem p = make_problem(2, 13, 17, 4, 2, 12, true, 9, 20.0f);
    const Inputs in = random_inputs(p, 21);
    expect_same_bits(run_cpu(in, dtype, Layout::strided), run_cpu(in, dtype, Layout::packed));
  }
}

TEST(CpuLayouts, StridedNonCausalMoreQueriesThanKeys) {
  const Problem p = make_problem(1, 19, 6, 3, 1, 5);
  const Inputs in = random_inputs(p, 22);
  expect_same_bits(run_cpu(in, DType::f32, Layout::strided), run_cpu(in));
}

TEST(CpuLayouts, ForwardWithoutLseWritesOnlyO) {
  const Problem p = make_problem(1, 5, 7, 2, 1, 4, true);
  const Inputs in = random_inputs(p, 23);
  const int64_t qs[4] = {p.B, p.Tq, p.H, p.d}, ks[4] = {p.B, p.Tk, p.Hkv, p.d};
  HostTensor q(DType::f32, Layout::strided, 4, qs), k(DType::f32, Layout::strided, 4, ks);
  HostTensor v(DType::f32, Layout::strided, 4, ks), o(DType::f32, Layout::strided, 4, qs);
  q.fill(in.q);
  k.fill(in.k);
  v.fill(in.v);
  TensorRef no_lse = o.ref();  // any shape; data == nullptr means "not written"
  no_lse.data = nullptr;
  no_lse.rank = 3;
  no_lse.shape[0] = p.B;
  no_lse.shape[1] = p.H;
  no_lse.shape[2] = p.Tq;
  Options options;
  options.backend = Backend::Cpu;
  forward(p, q.ref(), k.ref(), v.ref(), o.ref(), no_lse, options);
  EXPECT_FALSE(has_nan(o.read()));
  EXPECT_TRUE(o.padding_untouched());
  EXPECT_TRUE(same_bits(o.read(), run_cpu(in).o));
}

}  // namespace
}  // namespace gqattn::test
