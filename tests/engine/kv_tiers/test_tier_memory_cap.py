"""The host tier is capped by the memory the engine may still take: inside a container that is
its cgroup's limit less its usage (cgroup v2 or v1), not the node's free memory that
/proc/meminfo shows; without a limit, the node's."""

from engine.kv_tiers.setup import GIB, available_host_bytes, cgroup_headroom_bytes


def write(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_a_cgroup_v2_limit_leaves_its_headroom(tmp_path):
    root = write(tmp_path, {"memory.max": f"{8 * GIB}\n", "memory.current": f"{3 * GIB}\n"})
    assert cgroup_headroom_bytes(root) == 5 * GIB


def test_a_cgroup_v1_limit_leaves_its_headroom(tmp_path):
    root = write(tmp_path, {"memory/memory.limit_in_bytes": f"{6 * GIB}", "memory/memory.usage_in_bytes": f"{GIB}"})
    assert cgroup_headroom_bytes(root) == 5 * GIB


def test_no_limit_is_none_in_either_version(tmp_path):
    assert cgroup_headroom_bytes(write(tmp_path / "v2", {"memory.max": "max\n", "memory.current": "1\n"})) is None
    v1 = {"memory/memory.limit_in_bytes": "9223372036854771712", "memory/memory.usage_in_bytes": "1"}
    assert cgroup_headroom_bytes(write(tmp_path / "v1", v1)) is None
    assert cgroup_headroom_bytes(str(tmp_path / "none")) is None


def test_usage_past_the_limit_leaves_nothing(tmp_path):
    root = write(tmp_path, {"memory.max": f"{GIB}", "memory.current": f"{2 * GIB}"})
    assert cgroup_headroom_bytes(root) == 0


def test_the_available_memory_is_the_smaller_of_the_nodes_and_the_containers(tmp_path):
    node = available_host_bytes(str(tmp_path / "none"))
    assert node > 0
    tight = write(tmp_path / "tight", {"memory.max": f"{GIB}", "memory.current": "0"})
    assert available_host_bytes(tight) == min(node, GIB)
    roomy = write(tmp_path / "roomy", {"memory.max": f"{1 << 50}", "memory.current": "0"})
    assert available_host_bytes(roomy) == node
