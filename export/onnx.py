"""Export a trained captioner to ``encoder.onnx`` + ``step.onnx`` and prove each graph against PyTorch.

torch 2.13's default exporter (``dynamo=True``) at opset 18 (opset 17 breaks the
LSTM cell's Split), one file each (``external_data=False``),
only the row axis N dynamic. Every graph is checked by onnx, shape-inferred and
run by ONNX Runtime on random and real inputs; all mismatches are collected
into one error that names the output, both shapes and the max difference.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from edgecap import spec
from edgecap.checkpoint import LoadedModel, checkpoint_file
from edgecap.config import DEFAULT_MODEL
from edgecap.errors import EdgecapError
from edgecap.export.graphs import EncoderGraph, StepGraph, tensor_names
from edgecap.runtime.backends.ort import cpu_session
from edgecap.runtime.manifest import FORMAT_VERSION, Manifest, TensorSpec, file_sha256

OPSET = 18
# max |ORT - PyTorch| per output of the fp32 graphs, in units of max(1, max |PyTorch|): a sum over thousands of
# terms (a conv over a 7x7x1024 window) that reaches 50 rounds differently by ~1e-4 absolute, ~2e-6 relative.
TOLERANCE = {"encoder": 1e-4, "step": 1e-4}


@dataclass(frozen=True)
class Mismatch:
    graph: str
    output: str
    expected_shape: tuple[int, ...]
    actual_shape: tuple[int, ...]
    max_diff: float
    tolerance: float

    def __str__(self) -> str:
        return (f"{self.graph}:{self.output} shape {self.actual_shape} vs {self.expected_shape}, "
                f"max |diff| {self.max_diff:.3g} > {self.tolerance:g}")


class ExportValidationError(EdgecapError):
    """An exported graph disagrees with PyTorch; lists every failing output."""

    def __init__(self, mismatches: list[Mismatch]):
        self.mismatches = mismatches
        super().__init__("exported graphs disagree with PyTorch: " + "; ".join(map(str, mismatches)))


def _export(module: torch.nn.Module, args: tuple, path: Path, *, input_names: list[str], output_names: list[str],
            dynamic_shapes: dict) -> None:
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=input_names, output_names=output_names,
                          dynamic_shapes=dynamic_shapes, opset_version=OPSET, dynamo=True, external_data=False,
                          verbose=False)
    import onnx

    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _compare(graph: str, names: list[str], expected: tuple[torch.Tensor, ...], actual: list[np.ndarray],
             tolerance: float) -> list[Mismatch]:
    mismatches = []
    for name, want, got in zip(names, expected, actual, strict=True):
        want = want.numpy()
        if want.shape != got.shape:
            mismatches.append(Mismatch(graph, name, want.shape, got.shape, float("inf"), tolerance))
            continue
        if not want.size:
            continue
        diff = float(np.abs(want.astype(np.float64) - got.astype(np.float64)).max())
        # Integer outputs are choices (word ids), not values: they match exactly. A GLIED attribute id that flips
        # on a near-tie also changes that image's attribute keys/values, so exempting the ids would buy nothing.
        integer = np.issubdtype(want.dtype, np.integer)
        allowed = 0.0 if integer else tolerance * max(1.0, float(np.abs(want).max()))
        if diff > allowed:
            mismatches.append(Mismatch(graph, name, want.shape, got.shape, diff, allowed))
    return mismatches


def _specs(names: list[str], tensors: tuple[torch.Tensor, ...], role_for=spec.role_of) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(n, str(t.numpy().dtype), ("N", *t.shape[1:]) if t.dim() else (), role_for(n))
                 for n, t in zip(names, tensors, strict=True))


def _validate(encoder: EncoderGraph, step: StepGraph, out_dir: Path, real_pixels: np.ndarray, *, vocab_size: int,
              n_memory: int) -> list[Mismatch]:
    """Every output of both written graphs against PyTorch, on the real photos and on random pixels."""
    sessions = {g: cpu_session(out_dir / f"{g}.onnx") for g in ("encoder", "step")}
    size = real_pixels.shape[-1]
    mismatches = []
    checks = [torch.from_numpy(real_pixels.astype(np.float32)), torch.randn(3, 3, size, size)]
    for batch in checks:
        encoded = encoder(batch)
        got = sessions["encoder"].run(encoder.output_names, {spec.PIXELS: batch.numpy()})
        mismatches += _compare("encoder", encoder.output_names, encoded, got, TOLERANCE["encoder"])
        n = batch.shape[0]
        reorder = torch.from_numpy(np.random.default_rng(0).integers(0, n, n))
        feeds = (torch.randint(4, vocab_size, (n,)), torch.tensor(3), reorder, *encoded[n_memory:],
                 *encoded[: n_memory])
        got = sessions["step"].run(step.output_names, {name: f.numpy() for name, f in zip(step.input_names, feeds,
                                                                                           strict=True)})
        want = step(*feeds)
        # Top-k ids can legitimately swap between near-tied words; the log-probs themselves are compared.
        mismatches += [m for m in _compare("step", step.output_names, want, got, TOLERANCE["step"])
                       if m.output != spec.TOPK_IDS or m.actual_shape != m.expected_shape]
    return mismatches


@torch.no_grad()
def export_onnx(loaded: LoadedModel, out_dir: Path, *, real_pixels: np.ndarray, k: int = 6,
                max_length: int = 20) -> Manifest:
    """Write fp32 ``encoder.onnx``, ``step.onnx`` and ``edgecap.json`` to ``out_dir``; validated or raises."""
    captioner = loaded.model.eval()
    cache = getattr(captioner.decoder, "max_positions", None)  # decoders with a static KV cache declare its length
    if cache is not None and max_length >= cache:
        raise EdgecapError(f"max_length {max_length} needs decoding steps 0..{max_length} but the {loaded.model_id} "
                           f"KV cache holds {cache} (model max_positions); export with max_length <= {cache - 1} "
                           "or retrain with a larger model.max_positions")
    out_dir.mkdir(parents=True, exist_ok=True)
    memory_names, state_names = tensor_names(captioner, loaded.prep.image_size)
    encoder = EncoderGraph(captioner, memory_names, state_names)
    step = StepGraph(captioner, memory_names, state_names, k)
    rows = torch.export.Dim("N", min=1, max=4096)
    size = loaded.prep.image_size
    pixels = torch.from_numpy(real_pixels[:2].astype(np.float32))
    _export(encoder, (pixels,), out_dir / "encoder.onnx", input_names=[spec.PIXELS], output_names=encoder.output_names,
            dynamic_shapes={"pixels": {0: rows}})
    encoded = encoder(pixels)
    first = (torch.full((2,), 1), torch.tensor(0), torch.arange(2), *encoded[len(memory_names):],
             *encoded[: len(memory_names)])
    _export(step, first, out_dir / "step.onnx", input_names=step.input_names, output_names=step.output_names,
            dynamic_shapes={"tokens": {0: rows}, "step": None, "reorder": {0: rows},
                            "tensors": tuple({0: rows} for _ in first[3:])})

    mismatches = _validate(encoder, step, out_dir, real_pixels, vocab_size=len(loaded.vocab),
                           n_memory=len(memory_names))
    if mismatches:
        raise ExportValidationError(mismatches)

    source = checkpoint_file(loaded.path)
    step_roles = {spec.TOKENS: "input", spec.STEP: "input", spec.REORDER: "input"}
    manifest = Manifest(
        format_version=FORMAT_VERSION, model_id=loaded.model_id,
        model_config=asdict(captioner.decoder.config), encoder_config=asdict(loaded.encoder_config),
        vocab=loaded.vocab.to_json(), preprocessing=loaded.prep.to_json(),
        encoder_inputs=(TensorSpec(spec.PIXELS, "float32", ("N", 3, size, size), "input"),),
        encoder_outputs=_specs(encoder.output_names, encoder(pixels)),
        step_inputs=_specs(step.input_names, first, lambda n: step_roles.get(n, spec.role_of(n))),
        step_outputs=_specs(step.output_names, step(*first),
                            lambda n: spec.ROLE_STATE if n.endswith(spec.NEXT_SUFFIX) else spec.ROLE_OUTPUT),
        state_pairs={n: f"{n}{spec.NEXT_SUFFIX}" for n in state_names}, topk=k, max_length=max_length,
        opset=OPSET, graphs={"fp32": {"encoder": "encoder.onnx", "step": "step.onnx"}},
        source_checkpoint_sha256=file_sha256(source),
        source_checkpoint=None if source == DEFAULT_MODEL else str(source.resolve()),
    )
    return manifest.write(out_dir)
