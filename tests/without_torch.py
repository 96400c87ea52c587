"""Run a snippet in a fresh interpreter where importing a package raises (torch by default): how the parts that
must work without it are proven so."""

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == {package!r} or name.startswith({package!r} + "."):
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked in this test)", name=name)
    sys.meta_path.insert(0, Block())
""")


def run_without(package: str, body: str, *, timeout: float = 120) -> str:
    """Run ``body`` after the blocker of ``package``; assert it succeeded and left ``package`` unimported; return
    its stdout."""
    check = f"\nassert {package!r} not in sys.modules, {package + ' was imported'!r}\n"
    code = BLOCKER.format(package=package) + textwrap.dedent(body) + check
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout


def run_without_torch(body: str, *, timeout: float = 120) -> str:
    return run_without("torch", body, timeout=timeout)
