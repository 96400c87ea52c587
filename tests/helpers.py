"""What many tests share: the CLI run the way ``main()`` runs it, in this process or in one without a package."""

from pathlib import Path

from typer.testing import CliRunner

from tests.without_torch import run_without

SAMPLES = Path(__file__).resolve().parents[1] / "edgecap" / "assets" / "samples"
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    """Run the CLI the way main() does: user errors become one line and exit 2. Returns (exit status, output)."""
    from edgecap.cli import app
    from edgecap.errors import EdgecapError

    result = runner.invoke(app, list(args))
    if isinstance(result.exception, EdgecapError):
        return 2, f"error: {result.exception}"
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def run_cli_without(package: str, args: list[str]) -> str:
    """What ``edgecap ARGS`` prints on stdout and stderr, then ``exit N`` if it exits, in a fresh interpreter where
    ``package`` cannot be imported (an install without that extra)."""
    return run_without(package, f"""
        from edgecap.cli import main
        sys.argv = ["edgecap", *{args!r}]
        sys.stderr = sys.stdout
        try:
            main()
        except SystemExit as done:
            print("exit", done.code)
    """)
