"""The Unix socket listener (for sidecar clients) serves the same protocol as the TCP port."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient

from tests.integration.conftest import ServerProcess


def test_infer_over_the_unix_socket(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"unix:{server.unix_socket}")
    try:
        assert client.is_server_ready()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    finally:
        client.close()
