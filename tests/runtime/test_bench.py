"""edgecap bench: the torch-free timing core on a scripted clock, and the command on a tiny export.

Benchmarks live in the CLI and benchmarks/; nothing here asserts a timing threshold, only how the figures
relate (encoder + steps <= caption, the reference's ratio is 1, ...) and that the report has its fields.
"""

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from edgecap.runtime.search import SearchOptions
from edgecap.runtime.timing import (
    TimedSession,
    step_growth,
    step_ms_by_position,
    summarize,
    time_captions,
    with_speedups,
)
from edgecap.runtime.weight_bytes import onnx_weight_bytes, ort_weight_bytes
from edgecap.vocab import EOS, SPECIALS, Vocab
from tests.helpers import invoke
from tests.without_torch import run_without_torch

ENCODE_S, TILE_S, STEP_S = 0.005, 0.0004, 0.001  # what the scripted backend "spends" on the clock
WORDS = Vocab(SPECIALS + tuple(f"w{i}" for i in range(4, 12)))  # the ids the scripted session returns


class ScriptedClock:
    """Moves only when the scripted backend says so: the search's own work takes no time on it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedSession:
    """Uniform candidates; eos becomes available after three words."""

    def __init__(self, clock: ScriptedClock, k: int = 6):
        self.clock, self.k = clock, k

    def step(self, tokens, reorder, position):
        self.clock.now += STEP_S
        ids = np.tile(np.arange(4, 4 + self.k), (len(tokens), 1)).astype(np.int64)
        if position >= 3:
            ids[:, 0] = EOS
        logprobs = np.log(np.full((len(tokens), self.k), 1 / self.k, np.float32))
        return logprobs, ids, np.ones((len(tokens), 5), np.float32)

    def tile(self, beam_size):
        self.clock.now += TILE_S  # host-side tiling of memory and state: charged to the search


class ScriptedBackend:
    def __init__(self, clock: ScriptedClock):
        self.clock = clock

    def encode(self, pixels):
        self.clock.now += ENCODE_S
        return ScriptedSession(self.clock)


def test_timing_core_splits_a_caption_into_encoder_steps_and_search():
    clock = ScriptedClock()
    options = SearchOptions(beam_size=2, max_length=6)
    timings = time_captions(ScriptedBackend(clock), np.zeros((3, 3, 4, 4), np.float32), options, WORDS, runs=4,
                            warmup=2, clock=clock)
    assert timings.batch == 3 and len(timings.caption) == len(timings.steps) == 4
    steps = len(timings.steps[0])
    assert 4 <= steps <= 7 and all(len(s) == steps for s in timings.steps)
    np.testing.assert_allclose(timings.encoder, ENCODE_S)
    np.testing.assert_allclose(np.concatenate(timings.steps), STEP_S)
    np.testing.assert_allclose(timings.caption, ENCODE_S + TILE_S + steps * STEP_S)
    np.testing.assert_allclose(timings.search, TILE_S, atol=1e-12)

    row = summarize(timings, backend="ort", precision="fp32", options=options, threads=1, warmup=2,
                    step_weight_bytes=2_000_000, bandwidth_gb_s=10.0, peak_rss=123.0)
    caption_ms = 1e3 * (ENCODE_S + TILE_S + steps * STEP_S)
    assert (row.batch, row.beam, row.runs, row.steps_per_caption) == (3, 2, 4, steps)
    assert row.encoder_ms_p50 == pytest.approx(1e3 * ENCODE_S) and row.step_ms_p50 == pytest.approx(1e3 * STEP_S)
    assert row.caption_ms_p50 == pytest.approx(caption_ms) and row.caption_ms_p99 == pytest.approx(caption_ms)
    assert row.captions_per_s == pytest.approx(3 / (caption_ms / 1e3))
    assert row.search_overhead_share == pytest.approx(1e3 * TILE_S / caption_ms)
    assert row.step_floor_ms == pytest.approx(0.2)  # 2 MB at 10 GB/s
    assert row.peak_rss_mb == 123.0 and row.speedup_vs_torch is None
    assert row.step_ms_by_position == pytest.approx((1e3 * STEP_S,) * steps)


def test_step_profile_is_per_position_over_the_runs_that_reached_it():
    runs = [np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0]) * 1e-3, np.array([3.0, 1.0, 2.0, 4.0]) * 1e-3]
    profile = step_ms_by_position(runs)
    assert profile == pytest.approx((2.0, 1.0, 2.0, 3.0, 3.0, 3.0))
    assert step_growth(profile) == pytest.approx(3.0 / 2.0)
    assert step_growth(profile[:5]) is None and step_ms_by_position([]) == ()


def test_timed_session_forwards_step_and_tile():
    clock = ScriptedClock()
    inner = ScriptedSession(clock)
    timed = TimedSession(inner, clock)
    timed.tile(2)
    logprobs, ids, attention = timed.step(np.array([1, 1]), np.array([0, 1]), 0)
    assert logprobs.shape == ids.shape == (2, 6) and attention.shape == (2, 5)
    assert timed.step_seconds == [pytest.approx(STEP_S)] and clock.now == pytest.approx(TILE_S + STEP_S)


def test_speedups_are_against_the_torch_row_of_the_same_batch_and_beam():
    clock = ScriptedClock()
    timings = time_captions(ScriptedBackend(clock), np.zeros((1, 3, 4, 4), np.float32), SearchOptions(beam_size=1),
                            WORDS, runs=2, warmup=0, clock=clock)
    base = summarize(timings, backend="torch", precision="fp32", options=SearchOptions(beam_size=1), threads=1,
                     warmup=0)
    fast = replace(base, backend="ort", caption_ms_p50=base.caption_ms_p50 / 4, encoder_ms_p50=base.encoder_ms_p50 / 2)
    lone = replace(fast, beam=3)
    torch_row, ort_row, lone_row = with_speedups([base, fast, lone])
    assert torch_row.speedup_vs_torch == 1.0 and torch_row.encoder_speedup_vs_torch == 1.0
    assert ort_row.speedup_vs_torch == pytest.approx(4.0) and ort_row.encoder_speedup_vs_torch == pytest.approx(2.0)
    assert lone_row.speedup_vs_torch is None


def test_step_weight_bytes_count_what_a_run_reads(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    # Read through Gather (N rows only), here stored compactly behind a Cast as export writes an fp16-valued table.
    table = numpy_helper.from_array(np.ones((10, 4), np.float16), "table.fp16")
    weight = numpy_helper.from_array(np.ones((4, 3), np.float16), "weight")  # cast to fp32 once, read as fp32
    bias = numpy_helper.from_array(np.ones(3, np.float32), "bias")
    nodes = [helper.make_node("Cast", ["table.fp16"], ["table"], to=TensorProto.FLOAT),
             helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Cast", ["weight"], ["weight32"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["rows", "weight32"], ["product"]),
             helper.make_node("Add", ["product", "bias"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])],
                              initializer=[table, weight, bias])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    assert onnx_weight_bytes(path) == 4 * 3 * 4 + 3 * 4
    assert ort_weight_bytes(path) == 4 * 3 * 4 + 3 * 4  # ONNX Runtime's folded graph reads the same


def test_timing_core_and_machine_info_never_import_torch():
    run_without_torch("""
        from edgecap.runtime.machine import machine_info, memcopy_bandwidth_gb_s, peak_rss_mb
        info = machine_info()
        assert info["cpu"] and info["cores"] >= 1 and "torch" not in info["versions"]
        assert memcopy_bandwidth_gb_s(megabytes=8, repeats=2) > 0 and peak_rss_mb() > 0
    """)


def test_bench_without_an_export_directory_is_a_usage_error():
    code, output = invoke("bench")
    assert code == 2 and "Missing argument" in output and "Traceback" not in output


@pytest.mark.parametrize("args, message", [
    (("{missing}",), "no such directory"),
    (("{empty}",), "edgecap.json: not found"),
    (("{empty}", "--batch", "0"), "--batch '0'"),
    (("{empty}", "--backend", "tensorflow"), "--backend 'tensorflow'"),
])
def test_bad_bench_input_is_one_line_exit_2(tmp_path, args, message):
    args = [a.format(missing=tmp_path / "missing", empty=tmp_path) for a in args]
    code, output = invoke("bench", *args)
    assert code == 2 and message in output and len(output.strip().splitlines()) == 1, output


CONTRACT = {"backend": str, "precision": str, "batch": int, "beam": int, "encoder_ms_p50": float,
            "step_ms_p50": float, "caption_ms_p50": float, "caption_ms_p90": float, "caption_ms_p99": float,
            "captions_per_s": float, "search_overhead_share": float, "peak_rss_mb": float}


@pytest.mark.slow
def test_bench_command_reports_torch_and_ort_side_by_side(tiny_export, tmp_path):
    exp = tiny_export / "exp"
    json_file, markdown_file, plot_file = tmp_path / "b.json", tmp_path / "b.md", tmp_path / "b.png"
    code, output = invoke("bench", str(exp), "--backend", "torch,ort", "--precision", "fp32,int8", "--batch", "1",
                          "--beam", "1,2", "--runs", "3", "--warmup", "1", "--json", str(json_file),
                          "--markdown", str(markdown_file), "--plot", str(plot_file))
    assert code == 0, output
    assert "ort int8: skipped" in output and "torch int8: skipped" in output
    report = json.loads(json_file.read_text())
    assert json.loads((exp / "reports" / "bench.json").read_text())["results"] == report["results"]
    assert markdown_file.read_text() == (exp / "reports" / "bench.md").read_text()
    assert markdown_file.read_text().strip() in output
    assert plot_file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    machine = report["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and {"numpy", "onnxruntime", "torch"} <= set(machine["versions"])
    rows = report["results"]
    assert [(r["backend"], r["precision"], r["batch"], r["beam"]) for r in rows] == [
        ("torch", "fp32", 1, 1), ("torch", "fp32", 1, 2), ("ort", "fp32", 1, 1), ("ort", "fp32", 1, 2)]
    for row in rows:
        for name, kind in CONTRACT.items():
            assert isinstance(row[name], kind), (name, row[name])
        assert row["threads"] == 1 and row["runs"] == 3
        assert 0 < row["step_ms_p50"] < row["caption_ms_p50"] <= row["caption_ms_p90"] <= row["caption_ms_p99"]
        assert 0 < row["encoder_ms_p50"] < row["caption_ms_p50"]
        assert row["encoder_ms_mean"] + row["steps_ms_mean"] <= row["caption_ms_mean"] + 1e-9
        assert 0 <= row["search_overhead_share"] < 1 and row["captions_per_s"] > 0 and row["peak_rss_mb"] > 0
        assert row["steps_per_caption"] >= 2 and row["step_weight_bytes"] > 0 and row["step_floor_ms"] > 0
    assert [r["speedup_vs_torch"] for r in rows[:2]] == [1.0, 1.0]
    assert all(math.isfinite(r["speedup_vs_torch"]) and r["speedup_vs_torch"] > 0 for r in rows[2:])
    # The eager step computes what the fp32 step graph computes: one weight count, one floor.
    assert rows[0]["step_weight_bytes"] == rows[2]["step_weight_bytes"]
    assert "targets" not in report  # the bench reports figures, not goals
