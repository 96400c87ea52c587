"""The CUDA half of the TensorRT backend (``trt_cuda.Cuda``) on a real GPU through real cuda-python.

TensorRT itself is not needed: allocations, asynchronous copies, the on-device row repeat and CUDA-graph replay
are all cuda-python calls, so they are checked wherever a GPU and ``cuda.bindings`` exist. Elsewhere (CI) the
tests skip; ``tests/export/test_trt_contract.py`` covers the backend's logic against a simulated runtime.
"""

import types

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cudart():
    runtime = pytest.importorskip("cuda.bindings.runtime", reason="cuda-python (cuda.bindings) is not installed")
    err, count = runtime.cudaGetDeviceCount()
    if err != runtime.cudaError_t.cudaSuccess or count == 0:
        pytest.skip("no CUDA GPU is visible")
    return runtime


@pytest.fixture
def cuda(cudart):
    from edgecap.runtime.backends.trt_cuda import Cuda

    buffers = Cuda(cudart)
    yield buffers
    buffers.close()


def _pinned(cuda, like: np.ndarray) -> np.ndarray:
    return cuda.host(like.nbytes).view(like.dtype).reshape(like.shape)


def test_a_round_trip_through_device_memory_returns_the_same_values(cuda):
    values = np.random.default_rng(0).standard_normal((5, 7, 3)).astype(np.float32)
    pointer = cuda.malloc(values.nbytes)
    back = _pinned(cuda, values)
    back[:] = np.nan
    cuda.to_device(pointer, values)
    cuda.to_host(back, pointer)
    cuda.synchronize()
    np.testing.assert_array_equal(back, values)


@pytest.mark.parametrize("rows, times", [(1, 3), (3, 4), (2, 1)])
def test_repeat_rows_on_the_device_equals_numpy_repeat(cuda, rows, times):
    source = np.random.default_rng(rows * 10 + times).standard_normal((rows, 6, 5)).astype(np.float16)
    row_bytes = source[0].nbytes
    src, dst = cuda.malloc(source.nbytes), cuda.malloc(source.nbytes * times)
    cuda.to_device(src, source)
    cuda.repeat_rows(dst, src, rows=rows, row_bytes=row_bytes, times=times)
    back = _pinned(cuda, np.repeat(source, times, axis=0))
    back[:] = np.nan
    cuda.to_host(back, dst)
    cuda.synchronize()
    np.testing.assert_array_equal(back, np.repeat(source, times, axis=0))


def test_a_captured_launch_replays_on_new_data_at_the_same_addresses(cuda, cudart):
    """First launch runs directly, the second is captured, later ones replay the graph: each must copy what the
    source holds now, which is what a step replayed with fresh tokens relies on."""
    shape = (4, 8)
    src, dst = cuda.malloc(4 * 32), cuda.malloc(4 * 32)
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice

    def enqueue():
        err, = cudart.cudaMemcpyAsync(dst, src, 4 * 32, kind, cuda.stream)
        assert err == cudart.cudaError_t.cudaSuccess

    back = _pinned(cuda, np.zeros(shape, np.float32))
    rng = np.random.default_rng(1)
    for launch in range(4):
        values = rng.standard_normal(shape).astype(np.float32)
        cuda.to_device(src, values)
        cuda.launch("copy", enqueue)
        back[:] = np.nan
        cuda.to_host(back, dst)
        cuda.synchronize()
        np.testing.assert_array_equal(back, values, err_msg=f"launch {launch}")
        assert ("copy" in cuda.graphs) == (launch >= 1)


def test_close_frees_everything_and_a_second_backend_starts_clean(cudart):
    from edgecap.runtime.backends.trt_cuda import Cuda

    first = Cuda(cudart)
    first.malloc(1 << 20)
    first.host(1 << 16)
    first.close()
    assert first.device == [] and first.pinned == [] and first.graphs == {}
    second = Cuda(cudart)
    pointer = second.malloc(16)
    second.to_device(pointer, np.arange(4, dtype=np.float32))
    second.synchronize()
    second.close()


def test_the_device_identity_names_this_gpu(cudart):
    """What keys the engine cache: the GPU's name as text (cuda-python gives bytes or a char array) and its
    compute capability. The TensorRT version is passed through, so a stand-in carries it here."""
    from edgecap.runtime.backends.trt_cuda import current_device

    info = current_device(types.SimpleNamespace(__version__="10.3.0"), cudart)
    assert info.gpu and "\0" not in info.gpu and not info.gpu.startswith("b'")
    major, minor = info.compute_capability.split(".")
    assert int(major) >= 5 and minor.isdigit()


def test_without_tensorrt_the_refusal_names_tensorrt_and_not_cuda_python(cudart):
    from edgecap.errors import BackendUnavailableError
    from edgecap.runtime.backends.trt_cuda import require_tensorrt

    try:
        import tensorrt  # noqa: F401
    except (ImportError, OSError):
        with pytest.raises(BackendUnavailableError) as refusal:
            require_tensorrt()
        assert "TensorRT" in str(refusal.value) and "cuda-python" not in str(refusal.value)
    else:
        pytest.skip("TensorRT is installed here: require_tensorrt's refusal cannot be seen")
