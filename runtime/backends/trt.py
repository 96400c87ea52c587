"""Native TensorRT backend: the engines ``edgecap export --trt`` built, behind the search's StepSession.

Memory and state never leave the GPU. Every buffer is allocated once for the most rows the engines' profile
accepts, so addresses are fixed; the state lives in two buffer sets that swap roles each step (step t writes its
``state.*.next`` outputs into the set that step t+1 reads as ``state.*``; the graph gathers rows by ``reorder``
itself, so an input and its update must not alias). Per step only tokens, step and reorder go in and the top-k
candidates and attention (or, for parity, the full log-probs) come out, through pinned host buffers. The buffers
belong to the backend, so it serves one session at a time: ``encode`` retires the previous session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.runtime.backends.trt_cuda import Cuda, current_device, require_tensorrt
from edgecap.runtime.engines import GRAPHS, find_engine, rebuild_hint
from edgecap.runtime.manifest import Manifest, file_sha256

INPUTS = (spec.TOKENS, spec.REORDER, spec.STEP)  # what crosses to the device each step
FETCHED = (spec.TOPK_LOGPROBS, spec.TOPK_IDS, spec.ATTENTION, spec.LOGPROBS)  # what may come back


class _Engine:
    """A deserialised plan, its execution context and its I/O: names, numpy dtypes, shapes (-1 at N)."""

    def __init__(self, trt, runtime, path: Path):
        self.path = path
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise ModelError(f"{path}: TensorRT cannot deserialise this plan; rebuild it with `edgecap export --trt`")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtype = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.shape = {n: tuple(self.engine.get_tensor_shape(n)) for n in names}
        self.dynamic = [n for n in self.inputs if -1 in self.shape[n]]
        self.max_rows = min(int(self.engine.get_tensor_profile_shape(n, 0)[2][0]) for n in self.dynamic)

    def row_bytes(self, name: str) -> int:
        return int(np.prod(self.shape[name][1:], dtype=np.int64)) * self.dtype[name].itemsize

    def nbytes(self, name: str, rows: int) -> int:
        return self.row_bytes(name) * rows if -1 in self.shape[name] else self.dtype[name].itemsize

    def set_rows(self, rows: int) -> None:
        for name in self.dynamic:
            self.context.set_input_shape(name, (rows, *self.shape[name][1:]))

    def run(self, stream: int) -> None:
        if not self.context.execute_async_v3(stream):
            raise RuntimeError(f"TensorRT failed to run {self.path.name}")


class TrtStepSession:
    """Rows of one ``encode`` call on the backend's device buffers; implements the search's StepSession."""

    def __init__(self, backend: TrtBackend, images: int):
        self.backend, self.images, self.rows, self.side, self.steps = backend, images, images, 0, 0

    def tile(self, beam_size: int) -> None:
        if self.steps:
            raise RuntimeError("tile must come before the first step")
        self.backend._tile(self, beam_size)
        self.rows = self.images * beam_size

    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        topk_logprobs, topk_ids, attention = self.backend._step(self, tokens, reorder, position, FETCHED[:3])
        return topk_logprobs.astype(np.float32), topk_ids.astype(np.int64), attention.astype(np.float32)

    def step_logprobs(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> np.ndarray:
        """Full log-probs float32 (N, V) of one step, for parity's teacher-forced check."""
        return self.backend._step(self, tokens, reorder, position, FETCHED[3:])[0].astype(np.float32)


class TrtBackend:
    """Encoder and step engines of one precision, checked against this GPU and TensorRT before loading."""

    def __init__(self, directory: Path, manifest: Manifest, *, precision: str = "fp32", cuda_graphs: bool = False):
        trt, cudart = require_tensorrt()
        directory = Path(directory)
        device = current_device(trt, cudart)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)  # both must outlive the engines deserialised by them
        self.engines = {}
        for graph, source in zip(GRAPHS, manifest.graph_files(directory, precision), strict=True):
            record = find_engine(manifest.engines, directory=directory, graph=graph, precision=precision,
                                 device=device, source_sha256=file_sha256(source))
            self.engines[graph] = _Engine(trt, self.runtime, directory / record.file)
        self.directory, self.precision, self.cuda_graphs = directory, precision, cuda_graphs
        self.encoder, self.step_engine = self.engines["encoder"], self.engines["step"]
        self.memory = [t.name for t in manifest.encoder_outputs if spec.role_of(t.name) == spec.ROLE_MEMORY]
        self.pairs = dict(manifest.state_pairs)
        self._check_io()
        self.cuda = Cuda(cudart)
        encoder, step = self.encoder, self.step_engine
        self.encoded = {n: self.cuda.malloc(encoder.nbytes(n, encoder.max_rows))
                        for n in encoder.inputs + encoder.outputs}
        for name, pointer in self.encoded.items():
            encoder.context.set_tensor_address(name, pointer)
        rows = step.max_rows
        self.state = [{n: self.cuda.malloc(step.nbytes(m, rows)) for n, m in self.pairs.items()} for _ in range(2)]
        self.device = {n: self.cuda.malloc(step.nbytes(n, rows)) for n in step.inputs + step.outputs
                       if n not in self.pairs and n not in self.pairs.values()}
        self.staged = {n: self.cuda.host(step.nbytes(n, rows)) for n in (*INPUTS, *FETCHED) if n in self.device}
        for name, pointer in self.device.items():
            step.context.set_tensor_address(name, pointer)
        self.live: TrtStepSession | None = None
        self.shaped_rows = 0

    def _check_io(self) -> None:
        """Memory and state cross engines and steps as raw bytes: their dtypes and row sizes must agree."""
        encoder, step = self.encoder, self.step_engine
        links = [(encoder, n, step, n) for n in self.memory if n in step.inputs]
        links += [(encoder, n, step, self.pairs[n]) for n in self.pairs]
        links += [(step, self.pairs[n], step, n) for n in self.pairs if n in step.inputs]
        for a, x, b, y in links:
            if x not in a.shape or y not in b.shape or (a.dtype[x], a.shape[x][1:]) != (b.dtype[y], b.shape[y][1:]):
                raise ModelError(f"{b.path}: {y} does not match {a.path.name}'s {x} (dtype or shape); "
                                 f"{rebuild_hint(self.directory, self.precision)}")

    def encode(self, pixels: np.ndarray) -> TrtStepSession:
        """pixels float32 (N, 3, H, W) -> a session whose memory and state are on the GPU (N rows, beam 1)."""
        images = len(pixels)
        if images > self.encoder.max_rows:
            raise ModelError(f"{self.encoder.path}: takes at most {self.encoder.max_rows} images per call, got "
                             f"{images}; rebuild with `edgecap export {self.directory} --trt --max-batch {images}`")
        self.encoder.set_rows(images)
        self.cuda.to_device(self.encoded[spec.PIXELS], pixels.astype(self.encoder.dtype[spec.PIXELS]))
        self.encoder.run(self.cuda.handle)
        self.live = TrtStepSession(self, images)
        self._tile(self.live, 1)
        self.cuda.synchronize()  # the encoder's time belongs to encode, not to the first step
        return self.live

    def _tile(self, session: TrtStepSession, times: int) -> None:
        """Memory and state rows of the encoder's output repeated ``times`` into the step's buffers (state side 0)."""
        self._check_live(session)
        rows = session.images * times
        if rows > self.step_engine.max_rows:
            raise ModelError(f"{self.step_engine.path}: takes at most {self.step_engine.max_rows} rows, this needs "
                             f"{session.images} images x beam {times}; rebuild with `edgecap export {self.directory}"
                             f" --trt --max-batch {session.images} --beam {times}`")
        targets = [(n, self.device[n]) for n in self.memory if n in self.device]
        targets += [(n, self.state[0][n]) for n in self.pairs]
        for name, target in targets:
            self.cuda.repeat_rows(target, self.encoded[name], rows=session.images,
                                  row_bytes=self.encoder.row_bytes(name), times=times)
        session.side = 0

    def _step(self, session: TrtStepSession, tokens: np.ndarray, reorder: np.ndarray, position: int,
              fetch: tuple[str, ...]) -> list[np.ndarray]:
        self._check_live(session)
        step, rows = self.step_engine, session.rows
        if len(tokens) != rows:
            raise ValueError(f"step got {len(tokens)} tokens for a session of {rows} rows")
        for name, value in zip(INPUTS, (tokens, reorder, np.asarray(position)), strict=True):
            if name in self.staged:  # an input the graph does not read is pruned by TensorRT
                staged = self.staged[name][: step.nbytes(name, rows)].view(step.dtype[name])
                staged[...] = np.ravel(value)
                self.cuda.to_device(self.device[name], staged)
        if rows != self.shaped_rows:
            step.set_rows(rows)
            self.shaped_rows = rows
        read, write = self.state[session.side], self.state[1 - session.side]
        for name, updated in self.pairs.items():
            if name in step.inputs:
                step.context.set_tensor_address(name, read[name])
            step.context.set_tensor_address(updated, write[name])
        if self.cuda_graphs:
            self.cuda.launch((rows, session.side), lambda: step.run(self.cuda.handle))
        else:
            step.run(self.cuda.handle)
        out = []
        for name in fetch:
            host = self.staged[name][: step.nbytes(name, rows)].view(step.dtype[name])
            self.cuda.to_host(host, self.device[name])
            out.append(host.reshape(rows, *step.shape[name][1:]))
        self.cuda.synchronize()
        session.side, session.steps = 1 - session.side, session.steps + 1
        return [array.copy() for array in out]  # the pinned buffers are reused by the next step

    def _check_live(self, session: TrtStepSession) -> None:
        if session is not self.live:
            raise RuntimeError("this TensorRT session was retired by a later encode(); the backend's buffers serve "
                               "one session at a time")

    def close(self) -> None:
        """Free the device and pinned buffers; the backend cannot run afterwards."""
        self.live = None
        self.cuda.close()

    def __enter__(self) -> TrtBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
