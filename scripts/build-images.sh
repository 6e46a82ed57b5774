#!/usr/bin/env bash
# Build the sandbox image locally (no registry is reachable): a minimal root file system --
# /workspace/{inputs,work,artifacts}, /tmp, an /etc/passwd with the sandbox user uid 1000 and
# the usr-merge symlinks -- imported with `docker import`. Interpreters come from the host's
# /usr, bound read-only at run time by the docker executor. Idempotent: rebuilt only when the
# image is missing or FORCE=1.
set -euo pipefail
IMAGE="${SANDBOX_IMAGE:-policy-engine/sandbox:1}"

if [ "${FORCE:-0}" != "1" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "== image $IMAGE present"
  exit 0
fi
echo "== building $IMAGE"
python3 - "$IMAGE" <<'PY' | docker import \
    -c 'USER 1000:1000' -c 'WORKDIR /workspace/work' \
    -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8' \
    -c 'LABEL io.policy-engine.image=sandbox' - "$IMAGE" >/dev/null
import io, sys, tarfile, time

def entry(tf, name, kind, mode, uid=0, data=b"", target=""):
    info = tarfile.TarInfo(name)
    info.mtime, info.mode, info.uid, info.gid = int(time.time()), mode, uid, uid
    if kind == "dir":
        info.type = tarfile.DIRTYPE
    elif kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, target
    else:
        info.size = len(data)
    tf.addfile(info, io.BytesIO(data) if kind == "file" else None)

with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tf:
    for d in ("etc", "usr", "proc", "sys", "dev", "root", "workspace"):
        entry(tf, d, "dir", 0o755)
    entry(tf, "tmp", "dir", 0o1777)
    entry(tf, "workspace/inputs", "dir", 0o755)
    for d in ("workspace/work", "workspace/artifacts"):
        entry(tf, d, "dir", 0o755, uid=1000)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):
        entry(tf, link, "link", 0o777, target=target)
    entry(tf, "etc/passwd", "file", 0o644, data=b"root:x:0:0:root:/root:/usr/sbin/nologin\n"
          b"sandbox:x:1000:1000:sandbox:/workspace/work:/bin/sh\n")
    entry(tf, "etc/group", "file", 0o644, data=b"root:x:0:\nsandbox:x:1000:\n")
    entry(tf, "etc/nsswitch.conf", "file", 0o644, data=b"passwd: files\ngroup: files\n")
PY
echo "== built $IMAGE"
