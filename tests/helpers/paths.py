"""Where the tests find the repository and their data files, wherever a test module sits."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
CRDS = REPO / "charts" / "k25" / "crds"  # the CRDs' one copy: Helm installs them from the chart
CONTRACTS = REPO / "tests" / "fixtures" / "contracts"
# the Python of vLLM's CPU build with K25 on top (`make vllm`), for `k25 engine --backend vllm`
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
