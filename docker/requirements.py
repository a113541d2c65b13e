"""Print the requirements an image installs, one a line: pyproject.toml's dependencies plus
those of the given extras, an extra that names the project itself (k25[a,b]) expanded.
The images install these before the code, so that layer changes only with pyproject.toml.

    python docker/requirements.py pyproject.toml gateway
"""

import re
import sys
import tomllib


def requirements(project: dict, extras: list[str]) -> list[str]:
    extras_of = project.get("optional-dependencies", {})
    itself = re.compile(rf"{re.escape(project['name'])}\[([^\]]*)\]", re.IGNORECASE)
    wanted, todo, done = list(project["dependencies"]), list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in done:
            continue
        if extra not in extras_of:
            raise SystemExit(f"requirements.py: no extra {extra!r} in pyproject.toml (there are {', '.join(sorted(extras_of))})")
        done.add(extra)
        for requirement in extras_of[extra]:
            if match := itself.fullmatch(requirement.replace(" ", "")):
                todo.extend(match.group(1).split(","))
            elif requirement not in wanted:
                wanted.append(requirement)
    return wanted


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    with open(sys.argv[1], "rb") as f:
        print("\n".join(requirements(tomllib.load(f)["project"], sys.argv[2:])))
