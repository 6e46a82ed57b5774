"""Docker sessions' stateful calls: a python call's globals pickled for the next call
(proc-bwrap sessions run a live interpreter instead: session_interpreter.py).

Each stateful call is still one guarded proc.exec (its own decision, limits and evidence); the
code runs under a small wrapper that loads the session's globals from the workspace, runs the
code and saves them back (picklable values; modules as their names, re-imported). A call that
dies before saving leaves the previous state in place, and the next call says so on stderr
(``[session] state``); a state file that cannot be read is reported and replaced with a fresh
interpreter, never silently.
"""

from __future__ import annotations

STATE_DIR = ".session"  # in the workspace (the sandbox writes only there)
STATE_FILE = f"{STATE_DIR}/interpreter.pkl"
_MARK = f"{STATE_DIR}/running"

_WRAPPER = '''import os as _os, pickle as _pickle, sys as _sys, types as _types, importlib as _il
_G = {{"__name__": "__main__", "__builtins__": __builtins__}}
_os.makedirs({dir!r}, exist_ok=True)
if _os.path.exists({mark!r}):
    print("[session] state: the previous stateful call died before saving; its changes are "
          "lost, the state before it is kept", file=_sys.stderr)
try:
    with open({state!r}, "rb") as _f:
        for _k, _v in _pickle.load(_f).items():
            _G[_k] = _il.import_module(_v[1]) if isinstance(_v, tuple) and len(_v) == 2 \\
                and _v[0] == "\\0module" else _v
except FileNotFoundError:
    pass
except Exception as _e:
    print("[session] state: unreadable (%s): a fresh interpreter starts" % type(_e).__name__,
          file=_sys.stderr)
open({mark!r}, "w").close()
try:
    exec(compile({code!r}, "<session>", "exec"), _G)
finally:
    _keep = {{}}
    for _k, _v in list(_G.items()):
        if _k.startswith("__"):
            continue
        if isinstance(_v, _types.ModuleType):
            _keep[_k] = ("\\0module", _v.__name__)
            continue
        try:
            _pickle.dumps(_v)
        except Exception:
            continue
        _keep[_k] = _v
    with open({state!r} + ".tmp", "wb") as _f:
        _pickle.dump(_keep, _f)
    _os.replace({state!r} + ".tmp", {state!r})
    _os.unlink({mark!r})
'''


def stateful(code: str) -> str:
    """``code`` wrapped to run in the session's kept globals."""
    return _WRAPPER.format(dir=STATE_DIR, mark=_MARK, state=STATE_FILE, code=code)
