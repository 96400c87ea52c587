"""The models of edgecap's Triton repository that run in Triton's Python backend (``triton_repository.py`` writes
the ``model.py`` files that import them). ``triton_python_backend_utils`` exists only inside a Triton server.

``CaptionModel`` turns each request's image bytes into a caption with edgecap's beam search, the very search every
other backend runs; its encoder and step graphs are the repository's other two models, called through Triton's
business-logic scripting, so Triton schedules them (and runs them on TensorRT when the repository says so).
``GraphModel`` runs one exported graph with ONNX Runtime, for a server whose only backend is Python's.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError, ModelError
from edgecap.preprocess import load_image_bytes
from edgecap.runtime.backends.ort import OrtStepSession, cpu_session, encode_with
from edgecap.runtime.manifest import Manifest
from edgecap.runtime.pipeline import Captioner, caption_of
from edgecap.runtime.search import SearchOptions

OPTION_FIELDS = {f.name for f in dataclasses.fields(SearchOptions)}
ALIASES = {"beam": "beam_size"}  # the name `edgecap serve` and the CLI give it


def _utils():
    import triton_python_backend_utils

    return triton_python_backend_utils


def _version_dir(args: dict) -> Path:
    return Path(args["model_repository"]) / args["model_version"]


def _error(message: str):
    """A failed response the client sees as a client error with ``message`` as its reason."""
    utils = _utils()
    code = getattr(utils.TritonError, "INVALID_ARG", None)
    return utils.InferenceResponse(error=utils.TritonError(message, code) if code is not None
                                   else utils.TritonError(message))


class _BlsGraph:
    """Another model of the same server behind ONNX Runtime's ``run(output_names, feeds)`` call."""

    def __init__(self, model: str):
        self.model = model

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        utils = _utils()
        inputs = [utils.Tensor(name, np.ascontiguousarray(value.reshape(1) if value.ndim == 0 else value))
                  for name, value in feeds.items()]  # the step's position travels as a one-value vector
        response = utils.InferenceRequest(model_name=self.model, inputs=inputs,
                                          requested_output_names=list(output_names)).exec()
        if response.has_error():
            raise ModelError(f"Triton model {self.model}: {response.error().message()}")
        return [utils.get_output_tensor_by_name(response, name).as_numpy() for name in output_names]


class TritonBackend:
    """The runtime's Backend over the repository's encoder and step models."""

    def __init__(self, manifest: Manifest, encoder_model: str, step_model: str):
        self.manifest = manifest
        self.encoder, self.step = _BlsGraph(encoder_model), _BlsGraph(step_model)

    def encode(self, pixels: np.ndarray) -> OrtStepSession:
        return encode_with(self.encoder, self.step, self.manifest, pixels)


def request_options(text: str | None) -> SearchOptions:
    """A request's OPTIONS (a JSON object of SearchOptions fields; lists for the word lists), or ValueError."""
    if not text:
        return SearchOptions()
    try:
        fields = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError("OPTIONS is not JSON; send an object such as {\"beam\": 3}") from None
    if not isinstance(fields, dict):
        raise ValueError("OPTIONS must be a JSON object of decoding options, e.g. {\"beam\": 3}")
    fields = {ALIASES.get(key, key): value for key, value in fields.items()}
    unknown = sorted(set(fields) - OPTION_FIELDS)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(OPTION_FIELDS))}")
    try:
        return SearchOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    except (TypeError, ValueError) as err:
        raise ValueError(f"OPTIONS: {err}") from None


def _bytes(request, name: str) -> bytes | None:
    """The one value of a request's BYTES input (None when the optional input is absent)."""
    tensor = _utils().get_input_tensor_by_name(request, name)
    return None if tensor is None else bytes(tensor.as_numpy().reshape(-1)[0])


def _one_string(data: bytes) -> np.ndarray:
    return np.array([[data]], dtype=np.object_)


class CaptionModel:
    """IMAGE bytes (+ optional OPTIONS JSON) -> CAPTION, LOGPROB, ALTERNATIVES; the requests Triton batched together
    are encoded and searched together, those with the same options in one search."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        manifest = Manifest.read(_version_dir(args))
        self.captioner = Captioner(TritonBackend(manifest, parameters["encoder_model"], parameters["step_model"]),
                                   manifest)

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        groups: dict[SearchOptions, list[tuple[int, np.ndarray]]] = defaultdict(list)
        for index, request in enumerate(requests):
            try:
                options = request_options((_bytes(request, "OPTIONS") or b"").decode("utf-8", errors="replace"))
                pixels = load_image_bytes(_bytes(request, "IMAGE") or b"", "the request's IMAGE", self.captioner.prep)
                groups[options].append((index, pixels))
            except (EdgecapError, ValueError) as err:
                responses[index] = _error(str(err))
        for options, members in groups.items():
            try:
                found = self.captioner.search_n(np.stack([pixels for _, pixels in members]), options)
            except (EdgecapError, ValueError) as err:  # an option the export cannot run, a word it does not know
                for index, _ in members:
                    responses[index] = _error(str(err))
                continue
            for (index, _), hypotheses in zip(members, found, strict=True):
                responses[index] = self._answer(caption_of(None, hypotheses, self.captioner.vocab,
                                                           options.require_words))
        return responses

    @staticmethod
    def _answer(caption):
        utils = _utils()
        return utils.InferenceResponse(output_tensors=[
            utils.Tensor("CAPTION", _one_string(caption.text.encode())),
            utils.Tensor("LOGPROB", np.array([[caption.logprob]], dtype=np.float32)),
            utils.Tensor("ALTERNATIVES", _one_string(json.dumps(list(caption.alternatives)).encode()))])


class GraphModel:
    """One exported graph (``model.onnx`` beside this model's model.py) run by ONNX Runtime, inputs and outputs as
    the model's config names them."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.session = cpu_session(_version_dir(args) / "model.onnx")
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests: list) -> list:
        utils = _utils()
        responses = []
        for request in requests:
            feeds = {name: utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            wanted = list(request.requested_output_names()) or self.outputs  # the search asks for the top-k only
            results = self.session.run(wanted, feeds)
            tensors = [utils.Tensor(name, np.ascontiguousarray(value)) for name, value in zip(wanted, results,
                                                                                              strict=True)]
            responses.append(utils.InferenceResponse(output_tensors=tensors))
        return responses
