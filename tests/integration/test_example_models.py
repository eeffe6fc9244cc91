"""The example repository's python model and ensemble served (`inferd make-examples`): the
session server's ``tokenize`` (python backend) and ``text_embedding`` (tokenize -> embed)
answer through tritonclient exactly as the same model.py and ONNX model run in-process."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient

from inferd.python_backend import pb_utils

TEXTS = ["hello world", "", "naïve café, longer than sixteen bytes", "tokens"]


@pytest.fixture
def tokenizer(repository: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The served tokenize model.py, imported as its worker imports it."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    spec = importlib.util.spec_from_file_location(
        "model", repository / "tokenize" / "1" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text_input(texts: list[str]) -> grpcclient.InferInput:
    data = np.array([[text.encode()] for text in texts], dtype=np.object_)
    tensor = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return tensor


def in_process(tokenizer: ModuleType, repository: Path, texts: list[str]) -> np.ndarray:
    ids = np.stack([tokenizer.token_ids(text.encode()) for text in texts])
    session = onnxruntime.InferenceSession(
        str(repository / "embed" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (embedding,) = session.run(None, {"TOKEN_IDS": ids})
    return np.asarray(embedding)


def test_the_text_embedding_ensemble_answers_as_its_models_in_process(
    client: grpcclient.InferenceServerClient, tokenizer: ModuleType, repository: Path
) -> None:
    # One request: its rows reach embed as the one batch run in-process here, so the sums round
    # the same way and the answer is exact.
    result = client.infer("text_embedding", [text_input(TEXTS)])
    embedding = result.as_numpy("EMBEDDING")
    assert embedding.dtype == np.float32 and embedding.shape == (len(TEXTS), 8)
    np.testing.assert_array_equal(embedding, in_process(tokenizer, repository, TEXTS))
    assert not embedding[1].any() and embedding[0].any()  # "" has no tokens


def test_concurrent_texts_each_get_their_own_embedding(
    client: grpcclient.InferenceServerClient, tokenizer: ModuleType, repository: Path
) -> None:
    # Sent at once, the rows batch in tokenize's and embed's queues; each answer stays its own.
    with concurrent.futures.ThreadPoolExecutor(len(TEXTS)) as pool:
        answers = pool.map(
            lambda text: client.infer("text_embedding", [text_input([text])]), TEXTS * 4
        )
        embeddings = np.concatenate([answer.as_numpy("EMBEDDING") for answer in answers])
    # Equal up to float rounding: ONNX Runtime's sums may round differently with another batch
    # size, and how these requests batch in the server is the scheduler's choice.
    expected = in_process(tokenizer, repository, TEXTS * 4)
    np.testing.assert_allclose(embeddings, expected, rtol=1e-6, atol=1e-6)


def test_the_python_tokenizer_answers_alone(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("tokenize", [text_input(["hi", "é"])])
    ids = result.as_numpy("TOKEN_IDS")
    expected = np.zeros((2, 16), dtype=np.int64)
    expected[0, :2] = [ord("h") + 1, ord("i") + 1]  # byte b is id b + 1, 0 pads
    expected[1, :2] = [0xC3 + 1, 0xA9 + 1]
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, expected)
