// gqattn::release_workspace_memory() needs no GPU: a no-op in a build
// without CUDA; in a CUDA build with no device, or before any CUDA backend
// allocated workspace, there is no pool to trim. It returns quietly, as
// often as it is called.
#include <gtest/gtest.h>

#include "gqattn/attention.hpp"

namespace {

TEST(ReleaseWorkspaceMemory, ReturnsQuietlyWithoutCudaWork) {
  EXPECT_NO_THROW(gqattn::release_workspace_memory());
  EXPECT_NO_THROW(gqattn::release_workspace_memory());
}

}  // namespace
