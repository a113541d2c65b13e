"""Regenerate proto/k25_pb2.py from proto/k25.proto (`make proto`).

`generate_to(folder)` is also what the staleness test calls, so the committed code and
the test can never disagree about how the code is produced."""

import pathlib
import sys

PROTO_DIR = pathlib.Path(__file__).resolve().parent
PROTO_FILES = ["k25.proto"]


def generate_to(out_dir: pathlib.Path) -> None:
    from grpc_tools import protoc

    for name in PROTO_FILES:
        status = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", str(PROTO_DIR / name)])
        if status != 0:
            raise RuntimeError(f"protoc failed on {PROTO_DIR / name} (exit {status})")


if __name__ == "__main__":
    generate_to(PROTO_DIR)
    print(f"generated {', '.join(PROTO_FILES)} into {PROTO_DIR}", file=sys.stderr)
