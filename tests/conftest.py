"""Make this checkout importable as the collection mlstack.pve for plugin unit tests."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".venv" / "collections"
if COLLECTIONS.is_dir() and str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
