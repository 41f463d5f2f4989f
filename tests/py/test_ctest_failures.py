"""scripts/ctest_failures: after a failed `ctest -j`, each failed test's output is printed again (scripts/test runs
it so the reason lands at the end of a CI log). Checked on a real ctest run of a generated project: a passing test,
a failing one whose output has a dashed line of its own, and one killed by its timeout."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ctest_failures"

PROJECT = """cmake_minimum_required(VERSION 3.20)
project(ct NONE)
enable_testing()
add_test(NAME ok COMMAND sh -c "echo all-is-fine")
add_test(NAME dir/bad COMMAND sh -c "for i in 1 2 3 4 5; do echo line$i; done; echo ----; echo the-reason; exit 3")
add_test(NAME slow COMMAND sh -c "echo before-sleep; sleep 20")
set_tests_properties(slow PROPERTIES TIMEOUT 1)
"""


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_failed_tests_output_is_printed(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text(PROJECT)
    b = tmp_path / "b"
    subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(b)], check=True, capture_output=True)
    ct = subprocess.run(["ctest", "-j", "2"], cwd=b, capture_output=True, text=True)
    assert ct.returncode != 0
    p = run(b)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "==== failed: dir/bad (last 7 of 7 output lines)" in out, out
    assert "line1\nline2\nline3\nline4\nline5\n----\nthe-reason" in out, out
    assert "==== failed: slow" in out and "before-sleep" in out, out
    assert "all-is-fine" not in out and "failed: ok" not in out, out
    assert out.rstrip().endswith("2 failed test(s): dir/bad, slow"), out
    # --lines keeps the tail of a long output
    p = run(b, "--lines", "2")
    assert "==== failed: dir/bad (last 2 of 7 output lines)\n----\nthe-reason\n" in p.stdout, p.stdout


def test_no_failure_and_no_log(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text(PROJECT.split("add_test(NAME dir/bad")[0])
    b = tmp_path / "b"
    subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(b)], check=True, capture_output=True)
    subprocess.run(["ctest"], cwd=b, check=True, capture_output=True)
    p = run(b)
    assert p.returncode == 0 and "records no failed test" in p.stdout, p.stdout
    p = run(tmp_path / "missing")
    assert p.returncode == 1 and "no " in p.stderr
