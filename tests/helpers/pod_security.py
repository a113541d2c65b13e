"""The restricted Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards,
baseline and restricted profiles, latest version) as a check over a pod spec, plus the
read-only root filesystem K25 asks of every container. Returns what breaks the rules."""

ALLOWED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                        "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def containers_of(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def restricted_violations(pod: dict) -> list[str]:
    problems = []
    pod_context = pod.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"pod: {field} is on")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']}: type {sorted(kinds - ALLOWED_VOLUME_TYPES)} is not allowed")
    for sysctl in pod_context.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            problems.append(f"pod: sysctl {sysctl['name']} is not a safe one")
    problems += _context_violations("pod", pod_context)
    for container in containers_of(pod):
        where = f"container {container['name']}"
        context = container.get("securityContext", {})
        problems += _context_violations(where, context)
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{where}: capabilities must drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {capabilities['add']}")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{where}: procMount {context['procMount']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{where}: hostPort")
        if not _set_here_or_on_pod(context, pod_context, "runAsNonRoot", lambda v: v is True):
            problems.append(f"{where}: runAsNonRoot must be true (on the container or the pod)")
        if not _set_here_or_on_pod(context, pod_context, "seccompProfile",
                                   lambda v: v.get("type") in ("RuntimeDefault", "Localhost")):
            problems.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: readOnlyRootFilesystem must be true")
    return problems


def _context_violations(where: str, context: dict) -> list[str]:
    problems = []
    if context.get("windowsOptions", {}).get("hostProcess"):
        problems.append(f"{where}: windowsOptions.hostProcess")
    if context.get("runAsUser") == 0:
        problems.append(f"{where}: runAsUser 0")
    if context.get("seccompProfile", {}).get("type") == "Unconfined":
        problems.append(f"{where}: seccompProfile Unconfined")
    if context.get("appArmorProfile", {}).get("type") == "Unconfined":
        problems.append(f"{where}: appArmorProfile Unconfined")
    selinux = context.get("seLinuxOptions", {})
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        problems.append(f"{where}: seLinuxOptions {selinux}")
    return problems


def _set_here_or_on_pod(context: dict, pod_context: dict, field: str, good) -> bool:
    if field in context:
        return good(context[field])
    return field in pod_context and good(pod_context[field])


def pod_specs(objects) -> list[tuple[str, dict]]:
    """(kind/name, pod spec) of every workload among rendered objects."""
    specs = []
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
            specs.append((f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]))
        elif obj["kind"] == "Pod":
            specs.append((f"Pod/{obj['metadata']['name']}", obj["spec"]))
        elif obj["kind"] == "LeaderWorkerSet":
            group = obj["spec"]["leaderWorkerTemplate"]
            specs += [(f"LeaderWorkerSet/{obj['metadata']['name']}/{role}", group[f"{role}Template"]["spec"])
                      for role in ("leader", "worker")]
    return specs
