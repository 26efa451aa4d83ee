"""The node picture as one self-contained HTML file (for `cri-resmgr simulate --html`)."""

from __future__ import annotations

import json
from typing import Any

from resmgr.view.server import page

SCRIPT_TAG = '<script src="picture.js"></script>'


def standalone(doc: dict[str, Any]) -> str:
    """The live page with the state and the script inlined; it draws once and never polls."""
    html = page("index.html").decode()
    # "</" inside a script element would end it early
    data = json.dumps(doc).replace("</", "<\\/")
    script = page("picture.js").decode().replace("</", "<\\/")
    inline = f"<script>window.CRI_RESMGR_STATE = {data};</script>\n<script>\n{script}</script>"
    if SCRIPT_TAG not in html:
        raise RuntimeError("index.html lost its script tag")
    return html.replace(SCRIPT_TAG, inline)
