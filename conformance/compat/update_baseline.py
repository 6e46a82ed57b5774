"""Record additions to the public surface in baseline.json; never removes or changes an entry.

Run after adding an error code, an enum member or an evidence field:
    python3 conformance/compat/update_baseline.py
A removal, rename or type change is refused (exit 1): those break seed 000 §13's add-only rule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from policy_engine.conformance.compat import compare, merge, surface

BASELINE = Path(__file__).with_name("baseline.json")


def main() -> int:
    current = surface()
    baseline = json.loads(BASELINE.read_text(encoding="utf-8")) if BASELINE.exists() else {}
    breaks, added = compare(baseline, current)
    if breaks:
        print("refusing to update: the surface breaks the baseline (add-only, seed 000 §13):",
              file=sys.stderr)
        for line in breaks:
            print(f"  {line}", file=sys.stderr)
        return 1
    BASELINE.write_text(json.dumps(merge(baseline, current), indent=2) + "\n", encoding="utf-8")
    for line in added:
        print(f"added {line}")
    print(f"{BASELINE}: {len(added)} addition(s) recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
