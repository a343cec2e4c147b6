"""Regenerate nlp_pb2.py and nlp_pb2_grpc.py from nlp.proto: `python -m gpuvs.serve.codegen` (needs grpcio-tools).

`--check` says whether the checked-in files are up to date.
protoc's runtime-version guards are taken out, so the code runs with the protobuf and grpcio a machine has.
The messages need nothing newer than protobuf 4.21 / grpcio 1.63; pyproject.toml states those floors."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent  # the folder that holds the gpuvs package
PROTO = "gpuvs/serve/nlp.proto"
OUTPUTS = ("nlp_pb2.py", "nlp_pb2_grpc.py")
NOTE = "# Checked in by gpuvs: python -m gpuvs.serve.codegen (grpcio-tools {}); runtime-version guards removed.\n"

_PB_GUARD = re.compile(r"from google\.protobuf import runtime_version as _runtime_version\n|"
                       r"_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:    .*\n)*?\)\n")
_GRPC_GUARD = re.compile(r"GRPC_GENERATED_VERSION = .*?\n\n\n(?=class )", re.S)


def postprocess(name: str, text: str) -> str:
    if name.endswith("_pb2.py"):
        text, n = _PB_GUARD.subn("", text)
    else:
        text, n = _GRPC_GUARD.subn("", text)
        text = text.replace("import warnings\n", "")
    if n == 0:
        raise RuntimeError(f"protoc's output for {name} changed shape: update gpuvs/serve/codegen.py")
    return NOTE.format(tools_version()) + text


def tools_version() -> str:
    from importlib.metadata import version

    return version("grpcio-tools")


def _protoc(*args: str) -> None:
    """The generated files' text, by name (written nowhere)."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise SystemExit("regenerating needs grpcio-tools: pip install grpcio-tools") from None
    import importlib.resources

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    code = protoc.main(["protoc", f"-I{SRC}", f"-I{include}", *args, str(SRC / PROTO)])
    if code != 0:
        raise SystemExit(f"protoc failed on {SRC / PROTO} (status {code})")


def generate() -> dict[str, str]:
    """The generated files' text, by name (written nowhere)."""
    with tempfile.TemporaryDirectory() as out:
        _protoc(f"--python_out={out}", f"--grpc_python_out={out}")
        folder = Path(out) / Path(PROTO).parent
        return {name: postprocess(name, (folder / name).read_text()) for name in OUTPUTS}


def checked_in_version() -> str | None:
    first = (HERE / OUTPUTS[0]).read_text().split("\n", 1)[0] if (HERE / OUTPUTS[0]).exists() else ""
    m = re.search(r"\(grpcio-tools ([^)]+)\)", first)
    return m.group(1) if m else None


def _same_definitions() -> bool:
    """The checked-in module carries the .proto's messages and service, as this protoc reads it."""
    from google.protobuf import descriptor_pb2

    from gpuvs.serve import nlp_pb2, nlp_pb2_grpc

    with tempfile.TemporaryDirectory() as out:
        _protoc(f"--descriptor_set_out={out}/set.pb")
        fresh = descriptor_pb2.FileDescriptorSet.FromString(Path(out, "set.pb").read_bytes()).file[0]
    ours = descriptor_pb2.FileDescriptorProto.FromString(nlp_pb2.DESCRIPTOR.serialized_pb)
    messages = list(fresh.message_type)
    while messages:  # generated modules leave json_name out; a descriptor set has it
        m = messages.pop()
        messages.extend(m.nested_type)
        for f in m.field:
            f.ClearField("json_name")
    methods = [m.name for s in fresh.service for m in s.method]
    return fresh == ours and all(hasattr(nlp_pb2_grpc.NlpServicer, m) for m in methods)


def stale() -> list[str]:
    """Names of checked-in files that differ from what the .proto generates now."""
    if checked_in_version() != tools_version():
        return [] if _same_definitions() else list(OUTPUTS)
    return [name for name, text in generate().items()
            if not (HERE / name).exists() or (HERE / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--check" in argv:
        names = stale()
        print("up to date" if not names else "stale: " + ", ".join(names))
        return 1 if names else 0
    for name, text in generate().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
