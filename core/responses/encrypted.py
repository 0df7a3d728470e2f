"""Reasoning carried by the client: Codex sends ``store: false`` with ``include:
["reasoning.encrypted_content"]`` and sends each reasoning item back on the next turn, so the
reasoning must travel inside the item. This server has nothing to hide from the client who
read it: "encrypted" is base64 of the text, behind a marker, so a blob some other server wrote
is recognised and ignored."""
from __future__ import annotations

import base64
import binascii

MARKER = "qwen-serve:"


def seal(reasoning: str) -> str:
    return MARKER + base64.b64encode(reasoning.encode()).decode("ascii")


def unseal(blob: str) -> str:
    """The reasoning in a blob ``seal`` made; "" for any other."""
    if not blob.startswith(MARKER):
        return ""
    try:
        return base64.b64decode(blob[len(MARKER):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""
