"""Building checkpoints whose files verify but hold wrong contents, for tests.

Editing a file inside a checkpoint folder is caught by its manifest; to test what happens
with a checkpoint that is well-sealed but wrong (an impossible position, arrays MXNet cannot
read), the manifest has to be re-sealed with the new checksums, as these helpers do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxtrain.run import checkpoint
from mxtrain.run.layout import MANIFEST_FILE, STATE_FILE


def reseal(folder: Path, name: str, data: bytes) -> None:
    """Replace ``folder/name`` with ``data`` and update the manifest (sizes, sha256 and the
    manifest's own checksum) so that the checkpoint still verifies."""
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    del manifest["manifest_sha256"]
    manifest["files"][name] = checkpoint.file_digest(folder / name)
    (folder / MANIFEST_FILE).write_bytes(checkpoint._seal(manifest))


def reseal_position(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Let ``change`` edit the saved training position in ``folder/state.json``, then
    re-seal the manifest."""
    saved = json.loads((folder / STATE_FILE).read_text())
    change(saved["state"]["position"])
    reseal(folder, STATE_FILE, json.dumps(saved).encode())
