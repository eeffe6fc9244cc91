"""The example decoder's two ONNX models (example_decoder.py), run in-process by ONNX Runtime:
the one step the server iterates, stepped by hand, and the whole-generation baseline both
generate what numpy computes from the same weights."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime as ort
import pytest

from inferd.example_decoder import (
    HIDDEN,
    reference_tokens,
    write_decoder,
    write_whole_decoder,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("decoder")
    write_decoder(root / "decoder")
    write_whole_decoder(root / "decoder_whole")
    return root


def test_the_step_model_stepped_by_hand_generates_the_reference(folder: pathlib.Path) -> None:
    session = ort.InferenceSession(str(folder / "decoder" / "1" / "model.onnx"))
    token = np.array([[3], [200]], np.int64)
    length = np.array([[6], [2]], np.int32)
    hidden = np.zeros((2, HIDDEN), np.float32)
    step = np.zeros((2, 1), np.int32)
    tokens: list[list[int]] = [[], []]
    done_at: list[int | None] = [None, None]
    for k in range(6):
        token, done, hidden, step = session.run(
            None, {"TOKEN": token, "LENGTH": length, "H": hidden, "STEP": step}
        )
        for row in range(2):
            tokens[row].append(int(token[row][0]))
            if done[row][0] and done_at[row] is None:
                done_at[row] = k + 1
    assert tokens[0] == reference_tokens(3, 6)
    assert tokens[1][:2] == reference_tokens(200, 2)
    assert done_at == [6, 2]  # DONE once STEP reaches LENGTH


def test_the_whole_model_runs_its_batch_to_the_longest_length(folder: pathlib.Path) -> None:
    session = ort.InferenceSession(str(folder / "decoder_whole" / "1" / "model.onnx"))
    (tokens,) = session.run(
        None,
        {"TOKEN": np.array([[3], [200]], np.int64), "LENGTH": np.array([[6], [2]], np.int32)},
    )
    assert tokens.shape == (2, 6)
    assert tokens[0].tolist() == reference_tokens(3, 6)
    assert tokens[1][:2].tolist() == reference_tokens(200, 2)


def test_the_model_is_a_few_megabytes(folder: pathlib.Path) -> None:
    size = (folder / "decoder" / "1" / "model.onnx").stat().st_size
    assert 1 << 20 < size < 8 << 20
