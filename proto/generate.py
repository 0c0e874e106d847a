"""Regenerate the committed Python code for the rasd.api.v1 wire contract.

This is the only way the files under proto/gen/python are made. It runs the pinned grpcio-tools
protoc with `-Iproto`, so generated imports are already `from rasd.api.v1 import ...` and need no
rewriting, then writes the package `__init__.py` files protoc does not.

Usage: python proto/generate.py [--out DIR]   (default: proto/gen/python)
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
DEFAULT_OUT = PROTO_ROOT / "gen" / "python"
API_DIR = pathlib.Path("rasd") / "api" / "v1"
INIT_DOCSTRINGS = {
    pathlib.Path("rasd") / "api": '"""rasd wire contracts (generated; see proto/generate.py)."""\n',
    API_DIR: '"""rasd.api.v1: generated protobuf and gRPC modules. Never edit; run proto/generate.py."""\n',
}


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Generate Python, .pyi stubs and gRPC stubs for every proto into out_dir."""
    from grpc_tools import protoc  # imported here: only the dev extra installs grpcio-tools

    protos = sorted((PROTO_ROOT / API_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / API_DIR}")
    target = out_dir / API_DIR
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    proto_include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{proto_include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_ROOT)) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for rel, text in INIT_DOCSTRINGS.items():
        (out_dir / rel / "__init__.py").write_text(text)
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    files = generate(args.out)
    print(f"generated {len(files)} files under {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
