"""Fixtures the gateway's test modules share."""

import signal

import pytest

from tests.helpers.gateway_process import BACKEND_FLAGS, start_stack


@pytest.fixture(scope="package", params=sorted(BACKEND_FLAGS))
def smollm2_stack(tmp_path_factory, request):
    """A `k25 up` stack serving SmolLM2 on each backend with `k25 up`'s defaults, started once for
    every module that only sends it requests (a start loads the model, vLLM's imports too)."""
    folder = tmp_path_factory.mktemp("smollm2-stack")
    service = start_stack(str(folder / "up.log"), "--model", "smollm2-135m", "--log-dir", str(folder),
                          *BACKEND_FLAGS[request.param])
    yield service
    service.stop(signal.SIGINT)
