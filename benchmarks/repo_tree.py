"""A synthetic "real repository": a 150,000-file ``node_modules`` and a 20,000-object ``.git``.

Shared by ``benchmarks/mask_planning.py`` and ``tests/integration/test_mask_planning.py``.
1,500 packages of ten directories with ten files each (15,000 leaf-heavy directories, as npm
trees are), and loose objects fanned out over 256 ``.git/objects/xx`` directories.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIRS = ("", "lib", "lib/util", "dist", "dist/esm", "src", "test", "types", "docs", "bin")


def make_repo(root: Path, files: int = 150_000, objects: int = 20_000) -> Path:
    """Create the tree under ``root`` (which must not exist yet) and return ``root``."""
    nm = root / "node_modules"
    made, pkg = 0, 0
    while made < files:
        for sub in PACKAGE_DIRS:
            d = nm / f"pkg{pkg}" / sub
            d.mkdir(parents=True, exist_ok=True)
            for i in range(10):
                os.close(os.open(d / f"f{i}.js", os.O_CREAT | os.O_WRONLY, 0o644))
            made += 10
        pkg += 1
    for i in range(objects):
        d = root / ".git" / "objects" / f"{i % 256:02x}"
        d.mkdir(parents=True, exist_ok=True)
        os.close(os.open(d / f"{i:038x}", os.O_CREAT | os.O_WRONLY, 0o444))
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print('hello')\n")
    return root
