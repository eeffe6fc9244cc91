"""Run by a virtualenv with the KServe SDK (not inferd's): its v2 REST client
(kserve.InferenceRESTClient) against the server at argv[1] (http://host:port). Prints one JSON
object of what it saw; exits non-zero on any error."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(base_url: str) -> dict[str, object]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        a = np.arange(32, dtype=np.int32).reshape(2, 16)
        b = np.full((2, 16), 3, dtype=np.int32)
        seen: dict[str, object] = {}
        for name, call in (
            ("live", client.is_server_live(base_url)),
            ("ready", client.is_server_ready(base_url)),
            ("model_ready", client.is_model_ready(base_url, "simple")),
        ):
            try:
                seen[name] = await call
            except ValueError as e:  # a body it cannot read as JSON (json's error is one)
                seen[name] = f"{type(e).__name__}: {e}"
        for binary in (True, False):
            inputs = [
                InferInput("INPUT0", [2, 16], "INT32"),
                InferInput("INPUT1", [2, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a, binary_data=binary)
            inputs[1].set_data_from_numpy(b, binary_data=binary)
            request = InferRequest("simple", inputs, request_id=f"kserve-{binary}")
            response = await client.infer(base_url, request, model_name="simple")
            outputs = {o.name: o.as_numpy() for o in response.outputs}
            seen[f"binary={binary}"] = {
                "id": response.id,
                "sum_ok": bool(np.array_equal(outputs["OUTPUT0"], a + b)),
                "difference_ok": bool(np.array_equal(outputs["OUTPUT1"], a - b)),
            }
        return seen
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
