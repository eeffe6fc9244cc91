"""The chain of python models a BLS call carries (bls.py): how it crosses the request
parameters, and which calls close a cycle."""

from __future__ import annotations

import json

import inferd._proto.grpc_service_pb2 as pb
from inferd.python_backend.bls import (
    CALL_CHAIN_PARAMETER,
    ModelCall,
    call_chain,
    split_chain,
)
from inferd.transport.bls import encode_call


def test_a_call_carries_its_chain_as_a_request_parameter() -> None:
    call = ModelCall(model="c", version=-1, inputs={}, parameters='{"k": 1}', chain=("a", "b"))
    request = pb.ModelInferRequest.FromString(encode_call(call))
    assert request.parameters["k"].int64_param == 1
    assert json.loads(request.parameters[CALL_CHAIN_PARAMETER].string_param) == ["a", "b"]


def test_the_called_model_gets_the_chain_apart_from_its_parameters() -> None:
    parameters = json.dumps({"k": 1, CALL_CHAIN_PARAMETER: json.dumps(["a", "b"])})
    chain, rest = split_chain(parameters)
    assert chain == ("a", "b")
    assert json.loads(rest) == {"k": 1}
    assert split_chain('{"k": 1}') == ((), '{"k": 1}')  # a client's request: no chain


def test_a_chain_that_is_not_a_list_of_names_counts_as_none() -> None:
    for raw in ("not json", json.dumps({"a": 1}), json.dumps([1, 2]), 7):
        chain, rest = split_chain(json.dumps({CALL_CHAIN_PARAMETER: raw}))
        assert chain == ()
        assert json.loads(rest) == {}


def test_a_batch_s_chain_is_every_model_that_led_to_it_then_the_caller() -> None:
    # The chains of a batch's three requests, as the worker split them from their parameters.
    assert call_chain([("a", "b"), (), ("d", "a")], "c") == ("a", "b", "d", "c")
    assert call_chain([], "c") == ("c",)
