"""CPU time of server processes over a benchmark run, read from /proc: what a request costs
each part (the gateway, an engine, a peer's API server and engine core), beside what it
costs in wall time."""

import os


class ProcessGone(Exception):
    pass


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process `pid` has used so far, all its threads (not its
    children). Raises ProcessGone when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(f"no process {pid}") from None
    # the command name (field 2) may hold spaces and parentheses: fields after its last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def parse_cpu_of(specs: list[str]) -> dict[str, int]:
    """`NAME=PID` flags -> {name: pid}; ValueError naming the bad one."""
    watched = {}
    for spec in specs:
        name, _, pid = spec.partition("=")
        if not name or not pid.isdigit():
            raise ValueError(f"--cpu-of expects NAME=PID (e.g. gateway=1234), got {spec!r}")
        cpu_seconds(int(pid))  # ProcessGone now rather than after the run
        watched[name] = int(pid)
    return watched


class CpuMeter:
    """CPU seconds each watched process used between start() and per_request()."""

    def __init__(self, watched: dict[str, int]):
        self.watched = watched
        self._started: dict[str, float] = {}

    def start(self) -> None:
        self._started = {name: cpu_seconds(pid) for name, pid in self.watched.items()}

    def per_request(self, completed: int) -> dict[str, float | None]:
        """{name: CPU milliseconds per completed request} (None with nothing completed)."""
        used = {name: cpu_seconds(pid) - self._started[name] for name, pid in self.watched.items()}
        return {name: 1000 * seconds / completed if completed else None for name, seconds in used.items()}
