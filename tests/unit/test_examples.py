"""Tests for the example model repository generator."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from inferd.examples import make_examples, write_identity_model
from inferd.python_backend import pb_utils
from tests.unit.test_pb_utils import RecordingSender

ONNX_MODELS = ["simple", "identity_fp32", "mlp", "identity_bytes", "embed", "decoder"]
EXPECTED_MODELS = [
    *ONNX_MODELS[:4],
    "tokenize",
    "embed",
    "text_embedding",
    "generate",
    "decoder",
]
PYTHON_MODELS = ["tokenize", "generate"]

# onnxruntime's type string per protocol datatype (as reported by NodeArg.type).
ORT_TYPES: dict[str, str] = {
    "BOOL": "tensor(bool)",
    "UINT8": "tensor(uint8)",
    "UINT16": "tensor(uint16)",
    "UINT32": "tensor(uint32)",
    "UINT64": "tensor(uint64)",
    "INT8": "tensor(int8)",
    "INT16": "tensor(int16)",
    "INT32": "tensor(int32)",
    "INT64": "tensor(int64)",
    "FP16": "tensor(float16)",
    "BF16": "tensor(bfloat16)",
    "FP32": "tensor(float)",
    "FP64": "tensor(double)",
    "BYTES": "tensor(string)",
}

# numpy has no bfloat16 that onnxruntime accepts, and strings need str objects,
# so those two are only load-checked here.
NUMPY_DTYPES: dict[str, type[np.generic]] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}

CONFIG_TYPES: dict[str, str] = {dt: f"TYPE_{dt}" for dt in ORT_TYPES} | {"BYTES": "TYPE_STRING"}


def _session(path: pathlib.Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _model_path(root: pathlib.Path, name: str) -> pathlib.Path:
    return root / name / "1" / "model.onnx"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("repo")
    assert make_examples(root) == EXPECTED_MODELS
    return root


def test_layout(repo: pathlib.Path) -> None:
    for name in ONNX_MODELS:
        model = onnx.load(_model_path(repo, name))
        assert model.ir_version == 9
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    # identity_fp32 deliberately has no config; the server must complete it.
    with_config = {p.parent.name for p in repo.glob("*/config.pbtxt")}
    assert with_config == set(EXPECTED_MODELS) - {"identity_fp32"}
    for name in with_config:
        text = (repo / name / "config.pbtxt").read_text()
        assert f'name: "{name}"' in text
        platform = dict.fromkeys(PYTHON_MODELS, 'backend: "python"')
        platform["text_embedding"] = 'platform: "ensemble"'
        assert platform.get(name, 'platform: "onnxruntime_onnx"') in text
    for name in PYTHON_MODELS:
        assert [p.name for p in (repo / name / "1").iterdir()] == ["model.py"]
    assert list((repo / "text_embedding" / "1").iterdir()) == []  # an ensemble's is empty
    assert "max_batch_size: 8\n" in (repo / "simple" / "config.pbtxt").read_text()
    assert "max_batch_size: 64\n" in (repo / "mlp" / "config.pbtxt").read_text()
    bytes_cfg = (repo / "identity_bytes" / "config.pbtxt").read_text()
    assert "data_type: TYPE_STRING" in bytes_cfg
    assert "dims: [ -1 ]" in bytes_cfg


def test_simple(repo: pathlib.Path) -> None:
    sess = _session(_model_path(repo, "simple"))
    assert [i.shape for i in sess.get_inputs()] == [["batch", 16], ["batch", 16]]
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert out0.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


@pytest.mark.parametrize("length", [1, 37])
def test_identity_fp32(repo: pathlib.Path, length: int) -> None:
    sess = _session(_model_path(repo, "identity_fp32"))
    assert sess.get_inputs()[0].shape == ["batch", "length"]
    x = np.random.default_rng(length).standard_normal((2, length)).astype(np.float32)
    (y,) = sess.run(None, {"INPUT0": x})
    np.testing.assert_array_equal(y, x)


def _mlp_reference(model: onnx.ModelProto, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    n_layers = len(weights) // 2
    h = x
    for i in range(n_layers):
        h = h @ weights[f"fc{i}.weight"] + weights[f"fc{i}.bias"]
        if i < n_layers - 1:
            h = np.maximum(h, 0.0)
    return h


def test_mlp(repo: pathlib.Path) -> None:
    path = _model_path(repo, "mlp")
    sess = _session(path)
    assert sess.get_inputs()[0].shape == ["batch", 512]
    assert sess.get_outputs()[0].shape == ["batch", 10]
    x = np.random.default_rng(2).standard_normal((5, 512)).astype(np.float32)
    (y,) = sess.run(None, {"INPUT0": x})
    assert y.shape == (5, 10)
    assert y.dtype == np.float32
    expected = _mlp_reference(onnx.load(path), x.astype(np.float64))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_identity_bytes(repo: pathlib.Path) -> None:
    sess = _session(_model_path(repo, "identity_bytes"))
    assert sess.get_inputs()[0].type == "tensor(string)"
    # onnxruntime only takes str elements; the server decodes UTF-8 to get here.
    x = np.array([["hello", "wörld", ""], ["a\x00b", "x", "longer string"]], dtype=object)
    (y,) = sess.run(None, {"INPUT0": x})
    assert y.shape == x.shape
    assert y.tolist() == x.tolist()


def test_reproducible(tmp_path: pathlib.Path) -> None:
    make_examples(tmp_path / "a")
    make_examples(tmp_path / "b")
    written = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*"))
    assert written == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*"))
    for path in written:
        if (tmp_path / "a" / path).is_file():
            assert (tmp_path / "a" / path).read_bytes() == (tmp_path / "b" / path).read_bytes()


def load_model_py(repo: pathlib.Path, name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """An example's model.py imported as the worker imports it (with inferd's
    triton_python_backend_utils under Triton's name)."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    spec = importlib.util.spec_from_file_location("model", repo / name / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokenize(repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model_py(repo, "tokenize", monkeypatch).TritonPythonModel()
    config = (repo / "tokenize" / "config.pbtxt").read_text()
    assert "max_batch_size: 8\n" in config and "count: 1 kind: KIND_CPU" in config
    model.initialize(
        {"model_config": '{"output": [{"name": "TOKEN_IDS", "data_type": "TYPE_INT64"}]}'}
    )
    texts = np.array([[b"hi"], ["é".encode()], [b""], [b"x" * 20]], dtype=object)
    request = pb_utils.InferenceRequest(
        model_name="tokenize",
        inputs=[pb_utils.Tensor("TEXT", texts)],
        requested_output_names=["TOKEN_IDS"],
    )
    (response,) = model.execute([request])
    ids = pb_utils.get_output_tensor_by_name(response, "TOKEN_IDS").as_numpy()
    expected = np.zeros((4, 16), dtype=np.int64)
    expected[0, :2] = [ord("h") + 1, ord("i") + 1]
    expected[1, :2] = [0xC3 + 1, 0xA9 + 1]  # UTF-8 bytes of é
    expected[3, :] = ord("x") + 1  # cut at 16
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, expected)


def generate_request(
    prompt: bytes, max_tokens: int
) -> tuple[pb_utils.InferenceRequest, RecordingSender]:
    request = pb_utils.InferenceRequest(
        model_name="generate",
        inputs=[
            pb_utils.Tensor("PROMPT", np.array([prompt], dtype=np.object_)),
            pb_utils.Tensor("MAX_TOKENS", np.array([max_tokens], dtype=np.int32)),
        ],
        requested_output_names=["TOKEN"],
    )
    sender = RecordingSender()
    request._attach_response_sender(sender)  # what the worker does for a decoupled model
    return request, sender


def test_generate_streams_max_tokens_of_the_prompts_words_then_the_final_flag(
    repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = (repo / "generate" / "config.pbtxt").read_text()
    assert "model_transaction_policy { decoupled: true }" in config
    assert "max_batch_size: 0\n" in config
    model = load_model_py(repo, "generate", monkeypatch).TritonPythonModel()
    cases = [
        (b"the quick  brown fox", 6, [b"the", b"quick", b"brown", b"fox", b"the", b"quick"]),
        ("naïve café".encode(), 1, ["naïve".encode()]),
        (b"   ", 3, []),  # no words: no tokens
        (b"one two", 0, []),
        (b"one two", -2, []),
    ]
    requests = [generate_request(prompt, max_tokens) for prompt, max_tokens, _ in cases]
    assert model.execute([request for request, _ in requests]) is None  # senders answer
    for (_, sender), (_, _, expected) in zip(requests, cases, strict=True):
        *tokens, (final, flags) = sender.sent
        assert (final, flags) == (None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        assert [flags for _, flags in tokens] == [0] * len(expected)
        streamed = []
        for response, _ in tokens:
            assert response is not None
            token = pb_utils.get_output_tensor_by_name(response, "TOKEN")
            assert token is not None and token.shape() == [1]
            streamed.append(token.as_numpy()[0])
        assert streamed == expected


def test_embed(repo: pathlib.Path) -> None:
    path = _model_path(repo, "embed")
    sess = _session(path)
    assert sess.get_inputs()[0].shape == ["batch", 16]
    assert sess.get_outputs()[0].shape == ["batch", 8]
    table = numpy_helper.to_array(
        next(t for t in onnx.load(path).graph.initializer if t.name == "table")
    )
    assert table.shape == (257, 8)
    ids = np.zeros((3, 16), dtype=np.int64)
    ids[0, :3] = [5, 9, 5]
    ids[2, :] = 256
    (y,) = sess.run(None, {"TOKEN_IDS": ids})
    assert y.dtype == np.float32
    # The mean over the non-padding ids only; no ids at all give zeros.
    expected = np.stack([table[[5, 9, 5]].mean(axis=0), np.zeros(8), table[256]])
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


def test_rerun_overwrites(tmp_path: pathlib.Path) -> None:
    # Regenerating into an existing repository must succeed and be idempotent.
    make_examples(tmp_path)
    before = _model_path(tmp_path, "mlp").read_bytes()
    assert make_examples(tmp_path) == EXPECTED_MODELS
    assert _model_path(tmp_path, "mlp").read_bytes() == before


@pytest.mark.parametrize("datatype", list(ORT_TYPES))
def test_write_identity_model(tmp_path: pathlib.Path, datatype: str) -> None:
    model_dir = tmp_path / f"identity_{datatype.lower()}"
    write_identity_model(model_dir, datatype, max_batch_size=4)

    config = (model_dir / "config.pbtxt").read_text()
    assert f'name: "{model_dir.name}"' in config
    assert "max_batch_size: 4\n" in config
    assert config.count(f"data_type: {CONFIG_TYPES[datatype]}\n") == 2
    assert config.count("dims: [ -1 ]") == 2

    sess = _session(model_dir / "1" / "model.onnx")
    (inp,) = sess.get_inputs()
    (out,) = sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == (
        "INPUT0",
        ORT_TYPES[datatype],
        ["batch", "length"],
    )
    assert (out.name, out.type, out.shape) == (
        "OUTPUT0",
        ORT_TYPES[datatype],
        ["batch", "length"],
    )

    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        return
    raw = np.random.default_rng(3).integers(0, 100, size=(3, 5))
    x = (raw % 2 == 0) if dtype is np.bool_ else raw.astype(dtype)
    (y,) = sess.run(None, {"INPUT0": x})
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)


def test_write_identity_model_options(tmp_path: pathlib.Path) -> None:
    write_identity_model(tmp_path / "noconfig", "INT8", with_config=False)
    assert (tmp_path / "noconfig" / "1" / "model.onnx").is_file()
    assert not (tmp_path / "noconfig" / "config.pbtxt").exists()

    # Without batching the config has to carry the model's full rank.
    write_identity_model(tmp_path / "nobatch", "FP32", max_batch_size=0)
    config = (tmp_path / "nobatch" / "config.pbtxt").read_text()
    assert "max_batch_size: 0\n" in config
    assert config.count("dims: [ -1, -1 ]") == 2

    with pytest.raises(ValueError, match="unknown datatype"):
        write_identity_model(tmp_path / "bad", "FP8")
