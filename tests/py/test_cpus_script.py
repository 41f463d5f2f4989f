"""scripts/cpus: the CPUs the build and test jobs may use, nproc capped by a cgroup CPU quota (cgroup v2 cpu.max,
else v1 cfs quota / period, rounded up). Checked against fake cgroup trees (LATENT_CGROUP_ROOT) and taskset."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cpus"


def cpus(env_root=None, prefix=()):
    env = dict(os.environ)
    if env_root is not None:
        env["LATENT_CGROUP_ROOT"] = str(env_root)
    p = subprocess.run([*prefix, str(SCRIPT), "-v"], capture_output=True, text=True, env=env, check=True)
    return int(p.stdout.strip()), p.stderr.strip()


def nproc():
    return int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)


def v2(tmp_path, text):
    (tmp_path / "cpu.max").write_text(text)
    return tmp_path


@pytest.mark.parametrize("text, quota", [("max 100000\n", None), ("100000 100000\n", 1), ("50000 100000\n", 1),
                                         ("150000 100000\n", 2), ("6400000 100000\n", 64), ("garbage\n", None)])
def test_cgroup_v2_quota_caps_nproc(tmp_path, text, quota):
    n, why = cpus(v2(tmp_path, text))
    want = nproc() if quota is None else min(nproc(), quota)
    assert n == want, why
    assert f"nproc {nproc()}" in why
    assert f"cgroup quota {quota if quota is not None else 'none'}" in why


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus(tmp_path)[0] == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus(tmp_path)[0] == nproc()


def test_no_cgroup_files_is_nproc(tmp_path):
    assert cpus(tmp_path)[0] == nproc()


def test_affinity_mask(tmp_path):
    taskset = shutil.which("taskset")
    if taskset is None and os.environ.get("LATENT_NO_SKIP") != "1":
        pytest.skip("taskset (util-linux) is not installed")
    assert taskset is not None, "taskset (util-linux) is not installed"
    first = sorted(os.sched_getaffinity(0))[0]
    assert cpus(tmp_path, prefix=(taskset, "-c", str(first)))[0] == 1
