"""bench/context_parallel.py at toy size on the CPU (gloo, 2 processes): it
runs end to end and reports every method and pass. Skipped without torch or
gloo. The numbers at this size mean nothing; the GPU run is what measures."""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import context_parallel  # noqa: E402


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_toy_run_reports_every_method(tmp_path):
    out = tmp_path / "cp.json"
    assert context_parallel.main(["--world", "2", "--T", "32", "--H", "2", "--Hkv", "1",
                                  "--d", "8", "--device", "cpu", "--dtype", "f32",
                                  "--repeats", "1", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    for key in ("all_gather_fwd", "all_gather_fwd_bwd", "ring_fwd", "ring_fwd_bwd"):
        assert summary[key]["tokens_per_s_world"] > 0, key
        assert summary[key]["scaling"] > 0, key
