"""Runs the Python README's example, examples/train_block.py, at toy size on
the CPU: it trains a GQA block on gqattn.torch.attention for a few steps and
exits 1 unless the loss fell. Skipped without torch.
Run: pytest python/tests/test_example.py (after `pip install .`).
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (the example needs it)")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_block.py"


def test_train_block_toy_cpu():
    result = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--size", "toy"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tokens/s on cpu" in result.stdout
