"""The docker executor charges the CPU time the container used, read from its cgroup, not the
wall time it took (issue 10 item 7): a sleeping command costs almost nothing, a busy one its
CPU seconds, in run-once and warm-pool mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.executor_docker import cpu
from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from tests.integration.test_docker_executor import ctx_for, py

pytestmark = pytest.mark.integration
BUSY = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end:\n    pass\n"


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_cpu_ms_is_cpu_time_not_wall_time(tmp_path: Path, mode: str) -> None:
    ex = DockerExecutor(DockerOptions(mode=mode, pool_size=1))
    try:
        ex.execute(ctx_for(tmp_path), py("print(1)"))  # warm up (pool start, image check)
        idle = ex.execute(ctx_for(tmp_path), py("import time; time.sleep(1.5)"))
        busy = ex.execute(ctx_for(tmp_path), py(BUSY))
    finally:
        ex.close()
    assert idle.out["cpu_source"] == "cgroup", idle.out
    assert idle.out["duration_ms"] >= 1500
    assert idle.used.cpu_ms < 400, idle.used  # wall time was charged before: >= 1500
    assert busy.out["cpu_source"] == "cgroup"
    assert 750 <= busy.used.cpu_ms < 3000, busy.used
    for res in (idle, busy):  # each run-once parent is removed after reading
        assert not Path(f"/sys/fs/cgroup/cpuacct{cpu.parent_for(res.out['exec_id'])}").exists()
