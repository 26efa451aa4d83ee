#!/usr/bin/env python3
"""Regenerate the Python protobuf/gRPC modules from protos/.

The generated modules are committed under resmgr/generated/; tests/unit/app/test_units.py fails when
they are stale. Run this after editing any .proto file:

    python scripts/genproto.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# proto file (relative to protos/) -> Python package that holds its modules
TARGETS = {"cri/api.proto": "resmgr.generated.cri", "config/api.proto": "resmgr.generated.config",
           "config/status.proto": "resmgr.generated.config", "agent/api.proto": "resmgr.generated.agent",
           "agent/claims.proto": "resmgr.generated.agent",
           "hooks/api.proto": "resmgr.generated.hooks",
           "nri/api.proto": "resmgr.generated.nri", "ttrpc/request.proto": "resmgr.generated.ttrpc",
           "dra/api.proto": "resmgr.generated.dra", "dra/health.proto": "resmgr.generated.dra",
           "pluginregistration/api.proto": "resmgr.generated.pluginregistration"}


def generate(out_root: Path) -> list[Path]:
    """Generate every target below out_root; return the written files."""
    written = []
    for proto, package in TARGETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}",
                f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", proto,
            ]
            subprocess.run(cmd, check=True)
            src_dir = Path(tmp) / Path(proto).parent
            proto_pkg = str(Path(proto).parent).replace("/", ".")
            dest = out_root / package.replace(".", "/")
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(src_dir.iterdir()):
                text = f.read_text()
                # protoc imports siblings by proto path; make them package-absolute.
                text = re.sub(rf"^from {re.escape(proto_pkg)} import ", f"from {package} import ",
                              text, flags=re.M)
                (dest / f.name).write_text(text)
                written.append(dest / f.name)
    return written


if __name__ == "__main__":
    for path in generate(ROOT):
        print(path.relative_to(ROOT))
