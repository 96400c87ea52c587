"""`edgecap eval EXPORT`: the deployed graphs scored on a dataset with no torch, equal to their run on fp32."""

import json
import textwrap

import pytest

from tests.helpers import invoke
from tests.needs import needs_scoring
from tests.without_torch import run_without_torch


def eval_args(model, out, *extra):
    return ["eval", str(model), "--data", "shapes", "--split", "test", "--max-images", "16", "--json", str(out),
            *extra]


@needs_scoring
@pytest.mark.slow
def test_an_export_scores_like_its_run_without_torch(tiny_export, tmp_path):
    code, output = invoke(*eval_args(tiny_export / "run", tmp_path / "torch.json"))
    assert code == 0, output
    run_without_torch(f"""
        from typer.testing import CliRunner
        from edgecap.cli import app
        result = CliRunner().invoke(app, {eval_args(tiny_export / "exp", tmp_path / "ort.json")!r})
        assert result.exit_code == 0, (result.output, result.exception)
    """, timeout=300)
    torch_report, ort_report = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("torch", "ort"))
    assert (torch_report["backend"], ort_report["backend"], ort_report["precision"]) == ("torch", "ort", "fp32")
    assert ort_report["captions"] == torch_report["captions"]
    assert ort_report["metrics"]["CIDEr"] == pytest.approx(torch_report["metrics"]["CIDEr"])


@needs_scoring
@pytest.mark.slow
def test_fp16_graphs_are_scored_from_the_same_directory(tiny_export, tmp_path):
    code, output = invoke(*eval_args(tiny_export / "exp", tmp_path / "fp16.json", "--precision", "fp16"))
    assert code == 0, output
    report = json.loads((tmp_path / "fp16.json").read_text())
    assert report["precision"] == "fp16" and report["n_images"] == 16 and report["metrics"]["CIDEr"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("source, extra, message", [
    ("exp", ("--backend", "torch"), "is an export directory: run it with --backend ort, openvino or trt"),
    ("run", ("--precision", "int8"), "--precision int8 picks an export's graphs"),
    ("exp", ("--beam", "5"), "beam 5 needs 10 candidates per step but the step graph returns 6"),
])
def test_a_mismatched_source_and_backend_is_one_line(tiny_export, tmp_path, source, extra, message):
    code, output = invoke(*eval_args(tiny_export / source, tmp_path / "e.json", *extra))
    assert code == 2 and message in output, output
    assert not (tmp_path / "e.json").exists()


def test_scoring_without_pycocoevalcap_is_one_line(tmp_path):
    """A runtime-only install captions; asked to score, it names the extra to install instead of a traceback."""
    import subprocess
    import sys

    code = textwrap.dedent("""
        import sys
        class BlockMetrics:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "pycocoevalcap":
                    raise ImportError("blocked in this test")
        sys.meta_path.insert(0, BlockMetrics())
        sys.argv = ["edgecap", "eval", "--data", "shapes"]
        from edgecap.cli import main
        main()
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("error: scoring captions needs pycocoevalcap: pip install edgecap[metrics] "
                                     "(and a Java runtime on the PATH)")
