"""gqattn.release_workspace_memory: bound and exported (no torch needed)."""

import gqattn


def test_release_workspace_memory_is_bound_and_exported():
    assert "release_workspace_memory" in gqattn.__all__
    # A no-op without CUDA or before any CUDA call; callable twice.
    assert gqattn.release_workspace_memory() is None
    assert gqattn.release_workspace_memory() is None
