"""skaffold.yaml and the Dockerfiles checked against the tree: what skaffold builds exists,
what it deploys is this chart with value sets that exist (and render), and the images hold
every package, run as the user the chart and the operator expect, and write only to /tmp."""

import fnmatch
import json
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
import yaml

from k25.cli import build_parser
from operators.deployment import ENGINE_UID, engine_args
from operators.pool_spec import parse_pool_spec
from tests.helpers.helm_chart import CHART, CI_VALUES, RELEASE, helm, of_kind

ROOT = CHART.parent.parent
SKAFFOLD = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
# the newest config version (skaffold's pkg/skaffold/schema/latest since skaffold v2.19)
CURRENT_SCHEMA = "skaffold/v4beta14"
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def effective(profile: str | None) -> dict:
    """The config with one profile applied: the profile's fields replace the base's, section by section."""
    config = {"build": dict(SKAFFOLD["build"]), "deploy": dict(SKAFFOLD["deploy"])}
    if profile is not None:
        [found] = [p for p in SKAFFOLD["profiles"] if p["name"] == profile]
        for section in ("build", "deploy"):
            config[section].update(found.get(section, {}))
    return config


CONFIGS = [None, *(p["name"] for p in SKAFFOLD["profiles"])]


def has_value_path(values: dict, dotted: str) -> bool:
    node = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def test_skaffold_uses_the_current_schema_and_has_kind_and_gpu_profiles():
    assert SKAFFOLD["apiVersion"] == CURRENT_SCHEMA and SKAFFOLD["kind"] == "Config"
    assert {p["name"] for p in SKAFFOLD["profiles"]} == {"kind-cpu", "gpu"}
    [kind] = [p for p in SKAFFOLD["profiles"] if p["name"] == "kind-cpu"]
    assert re.fullmatch(kind["activation"][0]["kubeContext"], "kind-k25")  # kind names contexts kind-<cluster>


@pytest.mark.parametrize("profile", CONFIGS, ids=lambda p: p or "base")
def test_every_artifact_has_its_context_and_dockerfile(profile):
    artifacts = effective(profile)["build"]["artifacts"]
    assert artifacts
    for artifact in artifacts:
        context = ROOT / artifact["context"]
        assert context.is_dir(), artifact
        assert (context / artifact["docker"]["dockerfile"]).is_file(), artifact


@pytest.mark.parametrize("profile", CONFIGS, ids=lambda p: p or "base")
def test_the_deploy_installs_this_chart_with_existing_values_and_built_images(profile, tmp_path):
    config = effective(profile)
    built = {a["image"].replace("-", "_") for a in config["build"]["artifacts"]}
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    [release] = config["deploy"]["helm"]["releases"]
    assert (ROOT / release["chartPath"]).resolve() == CHART
    values_files = [(ROOT / f).resolve() for f in release["valuesFiles"]]
    assert values_files and all(f in CI_VALUES for f in values_files)  # so the chart tests render them too
    sets = []
    for key, template in release["setValueTemplates"].items():
        assert has_value_path(defaults, key), key
        [(kind, image)] = re.findall(r"\{\{\.IMAGE_(REPO|TAG)_(\w+)\}\}", template)
        assert image in built, f"{key} uses {image}, which this config does not build"
        sets.append(f"{key}={'registry.local/' + image if kind == 'REPO' else 'dev-1'}")
    # render as skaffold would, with its image values; engines run the image built for them
    result = helm("template", release["name"], str(CHART), *[a for f in values_files for a in ("--values", str(f))],
                  *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    # each component runs the image built for it, engines the one engine image this config builds
    for component in ("gateway", "chunker", "operator"):
        [deployment] = [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-{component}"]
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == f"registry.local/k25_{component}:dev-1"
    [engine_image] = built & {"k25_engine", "k25_engine_cpu"}
    assert {p["spec"]["image"] for p in of_kind(objects, "EnginePool")} == {f"registry.local/{engine_image}:dev-1"}
    assert release["name"] == RELEASE


def parts_built(config: dict) -> dict[str, str]:
    """image -> the part it is built for: its PART build argument, or the CUDA engine."""
    return {a["image"]: a["docker"].get("buildArgs", {}).get("PART", "engine-cuda")
            if a["docker"]["dockerfile"] == "docker/cpu.Dockerfile" else "engine-cuda" for a in config["build"]["artifacts"]}


def test_the_kind_loop_builds_no_cuda_image_and_asks_for_no_gpu():
    config = effective("kind-cpu")
    assert {a["docker"]["dockerfile"] for a in config["build"]["artifacts"]} == {"docker/cpu.Dockerfile"}
    assert parts_built(config) == {"k25-gateway": "gateway", "k25-chunker": "chunker", "k25-operator": "operator",
                                   "k25-engine-cpu": "engine-cpu"}
    assert config["build"]["local"]["push"] is False
    values = yaml.safe_load((ROOT / config["deploy"]["helm"]["releases"][0]["valuesFiles"][0]).read_text())
    assert values["model"] == "tiny-random"
    assert all(p["nodeType"] == "CPU" and p["gpusPerReplica"] == 0 for p in values["engine"]["pools"])


def test_the_gpu_profile_builds_the_cuda_engine_image():
    assert parts_built(effective("gpu")) == {"k25-gateway": "gateway", "k25-chunker": "chunker", "k25-operator": "operator",
                                             "k25-engine": "engine-cuda"}


# --- Dockerfiles ----------------------------------------------------------------------------

def instructions(dockerfile: pathlib.Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def final_stage(dockerfile: pathlib.Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def docker_ignored(path: str) -> bool:
    """.dockerignore's rules: the last pattern that matches the path or a parent of it wins."""
    ignored = False
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate, pattern = pattern.startswith("!"), pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        if any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_runs_as_the_uid_the_chart_and_operator_expect(dockerfile):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    [user] = [arg for op, arg in final_stage(dockerfile) if op == "USER"]
    assert user == f"{ENGINE_UID}:{ENGINE_UID}"  # numeric, so the kubelet can verify runAsNonRoot
    assert values["podSecurityContext"]["runAsUser"] == ENGINE_UID != 0
    env = " ".join(arg for op, arg in final_stage(dockerfile) if op == "ENV")
    assert "HOME=/tmp" in env and "PYTHONDONTWRITEBYTECODE=1" in env  # the root filesystem is read-only


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_copies_every_package_and_nothing_the_context_leaves_out(dockerfile):
    copied = [source for op, arg in instructions(dockerfile) if op == "COPY" and not arg.startswith("--from")
              for source in arg.split()[:-1]]
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not docker_ignored(source), f"{source} is left out of the build context by .dockerignore"
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()
                and any(fnmatch.fnmatch(p.name, pattern) for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])}
    assert packages <= set(copied)
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= set(copied)  # setuptools reads both


def test_the_dockerignore_keeps_the_virtualenv_and_caches_out():
    for path in (".venv/bin/python", ".cache/helm/helm", ".git/HEAD", "tests/test_chart_render.py", "k25/__pycache__/cli.pyc"):
        assert docker_ignored(path), path
    assert not docker_ignored("engine/model/llama.py")


# every image the Dockerfiles build from pyproject.toml's requirements: (Dockerfile, PART build
# argument, pyproject.toml extra it must install)
IMAGES = [("cpu.Dockerfile", "gateway", "gateway"), ("cpu.Dockerfile", "chunker", "chunker"),
          ("cpu.Dockerfile", "operator", "operator"), ("cpu.Dockerfile", "engine-cpu", "engine"),
          ("engine-cuda.Dockerfile", None, "engine")]
# and the one built on vLLM's image, whose pins win over pyproject.toml's (as in `make vllm`)
VLLM_DOCKERFILE = ROOT / "docker" / "engine-vllm.Dockerfile"


def image_requirements(dockerfile: str, part: str | None) -> list[str]:
    """The requirements the image installs: its `python /src/requirements.py ...` run as the
    image's shell runs it, with its PART, against this tree."""
    runs = " ".join(arg for op, arg in instructions(ROOT / "docker" / dockerfile) if op == "RUN")
    [command] = re.findall(r"python /src/requirements\.py [^&;>]+", runs)
    command = command.replace("python /src/requirements.py /src/pyproject.toml",
                              f"{sys.executable} {ROOT / 'docker' / 'requirements.py'} {ROOT / 'pyproject.toml'}")
    result = subprocess.run(["sh", "-c", command], env={"PART": part or ""}, capture_output=True, text=True, check=True)
    return result.stdout.split()


def test_the_dockerfiles_are_the_images_listed_here():
    assert sorted({dockerfile for dockerfile, _, _ in IMAGES} | {VLLM_DOCKERFILE.name}) == [p.name for p in DOCKERFILES]
    [check] = [arg for op, arg in instructions(ROOT / "docker" / "cpu.Dockerfile") if op == "RUN" and "case" in arg]
    assert re.search(r"case \"\$PART\" in gateway\|chunker\|operator\|engine-cpu\)", check)  # any other PART fails the build


@pytest.mark.parametrize("dockerfile, part, extra", IMAGES, ids=lambda v: v)
def test_each_image_installs_only_its_parts_extra(dockerfile, part, extra):
    wanted = image_requirements(dockerfile, part)
    assert wanted == PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"][extra]
    names = {re.match(r"[\w.-]+", r).group().lower() for r in wanted}
    if extra != "engine":
        assert not names & {"torch", "triton"}, names
    if extra in ("gateway", "chunker", "engine"):
        assert "kopf" not in names and "kubernetes" not in names
    assert not names & {"matplotlib", "tqdm"}  # benchmarks' only, never in an image


@pytest.mark.parametrize("dockerfile", [p for p in DOCKERFILES if p != VLLM_DOCKERFILE], ids=lambda p: p.name)
def test_the_images_pin_the_torch_the_makefile_pins(dockerfile):
    makefile_torch = re.search(r"torch==[\d.]+", (ROOT / "Makefile").read_text()).group()
    [torch] = [arg for op, arg in instructions(dockerfile) if op == "RUN" and "torch==" in arg]
    assert makefile_torch in torch
    if dockerfile.name == "cpu.Dockerfile":  # only the engine's image gets torch
        assert re.match(r'if \[ "\$PART" = engine-cpu \]; then pip install torch==', torch), torch


def test_the_cpu_image_takes_torch_from_the_cpu_index_and_the_engine_image_has_a_compiler_for_triton():
    cpu = " ".join(arg for op, arg in instructions(ROOT / "docker" / "cpu.Dockerfile") if op == "RUN")
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu
    engine = " ".join(arg for op, arg in final_stage(ROOT / "docker" / "engine-cuda.Dockerfile") if op == "RUN")
    assert "gcc" in engine


def test_the_engine_cpu_image_builds_its_kernels_ahead_and_carries_no_compiler():
    """Every instruction set's CPU kernels are built in the build stage (where a failure fails the
    image build); the image that runs has no compiler and reads them from the same folder."""
    dockerfile = ROOT / "docker" / "cpu.Dockerfile"
    steps = instructions(dockerfile)
    final = final_stage(dockerfile)
    build = steps[: len(steps) - len(final)]
    build_runs = " ".join(arg for op, arg in build if op == "RUN")
    assert "python -m engine.kernels.cpu_build" in build_runs and "g++" in build_runs
    assert not re.search(r"\b(g\+\+|gcc|clang|build-essential)\b", " ".join(arg for op, arg in final if op == "RUN"))
    kernels_dir = {re.search(r"K25_CPU_KERNELS_DIR=(\S+)", arg).group(1) for op, arg in steps
                   if op == "ENV" and "K25_CPU_KERNELS_DIR=" in arg}
    assert len(kernels_dir) == 1 and next(iter(kernels_dir)).startswith("/opt/k25/")  # copied with /opt/k25
    assert any(op == "ENV" and "K25_CPU_KERNELS_DIR=" in arg for op, arg in final)


def test_the_vllm_image_is_vllms_own_at_the_makefiles_version_with_k25_on_top_as_make_vllm_installs_it():
    makefile = (ROOT / "Makefile").read_text()
    version = re.search(r"^VLLM_VERSION := (\S+)$", makefile, re.MULTILINE).group(1)
    steps = instructions(VLLM_DOCKERFILE)
    assert [arg for op, arg in steps if op in ("ARG", "FROM")] == [f"VLLM_IMAGE=vllm/vllm-openai:v{version}", "${VLLM_IMAGE}"]
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert "pip install --no-deps /src" in runs and "torch" not in runs  # vLLM's torch and pins stay
    # what the engine needs and vLLM's image lacks, the engine extra's Redis client, as `make vllm` adds it
    [redis] = [r for r in PYPROJECT["project"]["optional-dependencies"]["engine"] if r.startswith("redis")]
    assert f"pip install '{redis}'" in runs and f"pip install --quiet '{redis}'" in makefile
    assert 'python3 -c "import vllm, engine.vllm_core.core, engine.serve.server"' in runs  # the build fails where the engine would


def test_the_vllm_image_runs_the_operators_engine_command_not_vllm_serve():
    """vLLM's image has ENTRYPOINT `vllm serve`, which would take the operator's arguments as its own."""
    steps = instructions(VLLM_DOCKERFILE)
    assert [arg for op, arg in steps if op == "ENTRYPOINT"] == ["[]"]
    command = json.loads(next(arg for op, arg in steps if op == "CMD"))
    spec = parse_pool_spec({"nodeType": "H100-80G", "model": "m", "chunkSize": 512, "backend": "vllm", "gpusPerReplica": 2})
    assert engine_args(spec, "p", RELEASE)[:2] == command[:2] == ["k25", "engine"]
    assert build_parser().parse_args(command[1:-1]).backend == "vllm"
