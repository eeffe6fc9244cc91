"""The example repository's python models and ensemble served (`inferd make-examples`): the
session server's ``tokenize`` (python backend) and ``text_embedding`` (tokenize -> embed)
answer through tritonclient exactly as the same model.py and ONNX model run in-process, and the
decoupled ``generate`` streams its documented tokens (docs/examples.md's snippet among them)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import io
import queue
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.python_backend import pb_utils

EXAMPLES_DOC = Path(__file__).resolve().parents[2] / "docs" / "examples.md"

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


def generate_inputs(prompt: bytes, max_tokens: int) -> list[grpcclient.InferInput]:
    tensors = [
        grpcclient.InferInput("PROMPT", [1], "BYTES"),
        grpcclient.InferInput("MAX_TOKENS", [1], "INT32"),
    ]
    tensors[0].set_data_from_numpy(np.array([prompt], dtype=np.object_))
    tensors[1].set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    return tensors


def generated(url: str, prompt: bytes, max_tokens: int) -> list[grpcclient.InferResult]:
    """Every response ``generate`` streams for one request, the final flag's own included."""
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    results: list[grpcclient.InferResult] = []
    with grpcclient.InferenceServerClient(url) as triton:
        triton.start_stream(callback=lambda result, error: answers.put((result, error)))
        triton.async_stream_infer(
            "generate", generate_inputs(prompt, max_tokens), enable_empty_final_response=True
        )
        while not results or not final(results[-1]):
            result, error = answers.get(timeout=30)
            if error is not None:
                raise error
            assert result is not None
            results.append(result)
        triton.stop_stream()
    assert answers.empty(), answers.get()  # nothing after the final flag
    return results


def final(result: grpcclient.InferResult) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "tokens"),
    [
        (b"the quick brown fox", 6, [b"the", b"quick", b"brown", b"fox", b"the", b"quick"]),
        (b"one", 3, [b"one"] * 3),
        (b"  ", 4, []),
        (b"one two", 0, []),
    ],
)
def test_generate_streams_its_tokens_in_order_then_the_final_flag(
    url: str, prompt: bytes, max_tokens: int, tokens: list[bytes]
) -> None:
    *streamed, last = generated(url, prompt, max_tokens)
    assert [final(result) for result in streamed] == [False] * len(tokens)
    assert [result.as_numpy("TOKEN").tolist() for result in streamed] == [[t] for t in tokens]
    assert final(last) and not last.get_response().outputs


def test_generate_answers_model_infer_unimplemented(
    client: grpcclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException, match="generate") as raised:
        client.infer("generate", generate_inputs(b"a b", 2))
    assert str(raised.value.status()) == "StatusCode.UNIMPLEMENTED", raised.value


def test_the_docs_streaming_snippet_prints_the_generated_tokens(url: str) -> None:
    blocks = re.findall(r"```python\n(.*?)```", EXAMPLES_DOC.read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if '"generate"' in block]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet.replace('"localhost:8001"', repr(url)), str(EXAMPLES_DOC), "exec"), {})
    assert out.getvalue().splitlines() == ["to", "be", "or", "not", "to", "be"]
