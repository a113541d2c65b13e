"""The predictive policy as a git revision has it, to run side by side with the working
tree's in the simulation (`k25 simulate --against main`): the module's source is read with
`git show` and loaded under its own name, so both versions live in one process."""

import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

POLICY_PATH = "operators/predictive_policy.py"
REPO = Path(__file__).resolve().parent.parent


@functools.cache
def predictive_policy_at(revision: str):
    if not re.fullmatch(r"[\w./@^~-]+", revision) or revision.startswith("-"):
        raise ValueError(f"not a git revision: {revision!r}")
    shown = subprocess.run(["git", "show", f"{revision}:{POLICY_PATH}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        raise ValueError(f"cannot read {POLICY_PATH} at {revision!r}: {shown.stderr.strip()}")
    name = "predictive_policy_at_" + re.sub(r"\W", "_", revision)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    sys.modules[name] = module  # dataclasses look their module up by name
    exec(compile(shown.stdout, f"{revision}:{POLICY_PATH}", "exec"), module.__dict__)
    return module
