"""Run a snippet in a fresh interpreter where importing torch raises: how the torch-free parts are proven so."""

import subprocess
import sys
import textwrap

BLOCK_TORCH = textwrap.dedent("""
    import sys
    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")
    sys.meta_path.insert(0, BlockTorch())
""")


def run_without_torch(body: str, *, timeout: float = 120) -> str:
    """Run ``body`` after the torch blocker; assert it succeeded and left torch unimported; return its stdout."""
    code = BLOCK_TORCH + textwrap.dedent(body) + '\nassert "torch" not in sys.modules, "torch was imported"\n'
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout
