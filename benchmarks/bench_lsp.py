"""Language-server latency on a 1,000-rule policy, with a real LSP client (pytest-lsp) over stdio.

    PYTHONPATH=. python3 benchmarks/bench_lsp.py [--rules N] [--edits K] [--quick] [--root DIR]

- one-line edit: `didChange` (an incremental edit renaming one rule) to the
  `publishDiagnostics` carrying that version, after the buffer has been idle (the full analysis
  of the previous version done) and while typing (edits 200 ms apart);
- burst: five edits 50 ms apart, from the last `didChange` to the publish of its version.

`--root DIR` runs the server from another checkout (to compare with an older version).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from scale_policy import scale_policy  # noqa: E402

PUBLISH = types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS


class Probe:
    """Records when each publishDiagnostics arrived, by (uri, version)."""

    def __init__(self, client: LanguageClient) -> None:
        self.seen: dict[tuple[str, int | None], float] = {}
        proto: Any = client.protocol
        original = proto._handle_notification

        def hook(method: str, params: Any) -> None:
            if method == PUBLISH:
                self.seen.setdefault((params.uri, params.version), time.perf_counter())
            original(method, params)

        proto._handle_notification = hook

    async def until(self, uri: str, version: int, timeout: float = 60) -> float:
        deadline = time.perf_counter() + timeout
        while (uri, version) not in self.seen:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no diagnostics for version {version}")
            await asyncio.sleep(0.001)
        return self.seen[(uri, version)]


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


def _line(name: str, samples: list[float]) -> str:
    return (f"| {name} | {len(samples)} | {statistics.median(samples):.0f} | "
            f"{_p95(samples):.0f} | {max(samples):.0f} |")


async def _run(rules: int, edits: int, root: Path) -> list[str]:
    text = scale_policy(rules).sbpolicy
    rows = text.split("\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scale.sbpolicy"
        path.write_text(text)
        # `root`'s engine first on the path, whatever the working directory
        start = (f"import sys; sys.path.insert(0, {str(root)!r}); sys.argv = ['policy-engine', "
                 "'lsp']; from policy_engine.cli.main import main; main()")
        config = ClientServerConfig(server_command=[sys.executable, "-c", start])
        client: Any = await config.start()
        probe = Probe(client)
        await client.initialize_session(types.InitializeParams(
            capabilities=types.ClientCapabilities()))
        uri = path.as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="sbpolicy", version=1, text=text)))
        await probe.until(uri, 1)
        version = 1

        def edit(k: int) -> int:
            nonlocal version
            version += 1
            line = 2 + (k * 37) % rules  # a rule line (row 0 is the header, row 1 blank)
            row = rows[line]
            new = row.replace('" ', f'x{k}" ', 1)  # rename the rule: one line, still valid
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(line, 0), types.Position(line, len(row))),
                    text=new)]))
            rows[line] = new
            return version

        idle, typing, bursts = [], [], []
        for k in range(edits):
            await asyncio.sleep(1.5)  # the previous version's full analysis is done
            sent = time.perf_counter()
            v = edit(k)
            idle.append((await probe.until(uri, v) - sent) * 1000)
        for k in range(edits):
            sent = time.perf_counter()
            v = edit(1000 + k)
            typing.append((await probe.until(uri, v) - sent) * 1000)
            await asyncio.sleep(max(0.0, 0.2 - (time.perf_counter() - sent)))
        for b in range(max(3, edits // 4)):
            await asyncio.sleep(1.5)
            for k in range(5):
                sent = time.perf_counter()
                v = edit(2000 + b * 5 + k)
                if k < 4:
                    await asyncio.sleep(0.05)
            bursts.append((await probe.until(uri, v) - sent) * 1000)
        await client.shutdown_session()
    return [_line("one-line edit, buffer idle before", idle),
            _line("one-line edit while typing (200 ms apart)", typing),
            _line("burst of 5 edits 50 ms apart: the last one", bursts)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="8 edits of each kind")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    args = parser.parse_args()
    edits = 8 if args.quick else args.edits
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} CPUs; "
          f"{args.rules} rules; server from {args.root}")
    print("| didChange → publishDiagnostics | n | median ms | p95 ms | max ms |")
    print("|---|---|---|---|---|")
    for line in asyncio.run(_run(args.rules, edits, args.root)):
        print(line)


if __name__ == "__main__":
    main()
