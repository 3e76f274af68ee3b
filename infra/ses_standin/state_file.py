"""The stand-in's small state files (configuration sets, subscriptions, streams): JSON written
whole to a temporary file and renamed over the old one, so a reader or a restart after a
crash finds the old state or the new one, never half of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)
