#!/usr/bin/env python3
"""Write the sections of config/schemas/policy.schema.json that policies declare as options.

The checked-in file must equal this output (a unit test compares them); run it after
changing a policy's options: `.venv/bin/python scripts/policy-schema.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resmgr.policies import declared_sections  # noqa: E402

PATH = Path(__file__).resolve().parent.parent / "config" / "schemas" / "policy.schema.json"


def generated() -> str:
    doc = json.loads(PATH.read_text())
    doc["properties"].update(declared_sections())
    return json.dumps(doc, indent=2) + "\n"


if __name__ == "__main__":
    PATH.write_text(generated())
