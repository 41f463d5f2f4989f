"""The build names its commit: `latent --version` and the server's /version report the git commit of the source
tree the binary was built from (cmake/git_version.cmake, re-run at every build), with -dirty when tracked files
differed, and "unknown" without git."""
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LATENT = os.environ.get("LATENT_BIN", str(ROOT / "build" / "ci" / "latent"))
SCRIPT = ROOT / "cmake" / "git_version.cmake"
GIT = shutil.which("git")
VERSION_RE = re.compile(r"^latent (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}(?:-dirty)?|unknown), (Release|Debug)\)$")


def head_commit(tree):
    if not GIT:
        return None
    p = subprocess.run([GIT, "-C", str(tree), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if p.returncode != 0 or Path(p.stdout.strip()).resolve() != Path(tree).resolve():
        return None
    return subprocess.run([GIT, "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def cli_version():
    p = subprocess.run([LATENT, "--version"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = VERSION_RE.match(p.stdout.strip())
    assert m, p.stdout
    return m.group(1), m.group(2), m.group(3)


def test_cli_version_names_the_commit():
    _, commit, _ = cli_version()
    head = head_commit(ROOT)
    if head is None:
        assert commit == "unknown"
    else:  # built from this checkout (a rebuild after a new commit refreshes it: the build re-reads git)
        assert commit.split("-")[0] == head


def test_server_version_matches_cli(tmp_path):
    version, commit, build_type = cli_version()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([LATENT, "serve", "--port", str(port), "--threads", "1"], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        v = None
        while time.time() < deadline and v is None:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:  # /version answers while the model is still loading
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=2) as r:
                    v = json.loads(r.read())
            except OSError:
                time.sleep(0.1)
        assert v is not None, "no /version in 60 s"
        assert v["version"] == version and v["git_sha"] == commit and v["build_type"] == build_type
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- the generator itself, on throw-away repositories ------------------------------------------------------------

def generate(src, out, git=GIT):
    subprocess.run(["cmake", f"-DGIT={git or ''}", f"-DSRC={src}", f"-DOUT={out}", "-P", str(SCRIPT)], check=True,
                   capture_output=True)
    m = re.search(r'#define LATENT_GIT_COMMIT "([^"]*)"', Path(out).read_text())
    assert m, Path(out).read_text()
    return m.group(1)


def git(repo, *args):
    return subprocess.run([GIT, "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    (r / "a.txt").write_text("one\n")
    (r / "sub").mkdir()
    (r / "sub" / "b.txt").write_text("two\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "first")
    return r


def test_generator_clean_dirty_new_commit(repo, tmp_path):
    out = tmp_path / "h" / "latent_build_info.h"
    out.parent.mkdir()
    sha = git(repo, "rev-parse", "--short=12", "HEAD").strip()
    assert generate(repo, out) == sha
    (repo / "untracked.txt").write_text("x\n")
    assert generate(repo, out) == sha  # untracked files do not make a tree dirty
    (repo / "a.txt").write_text("changed\n")
    assert generate(repo, out) == sha + "-dirty"
    git(repo, "commit", "-q", "-am", "second")
    sha2 = git(repo, "rev-parse", "--short=12", "HEAD").strip()
    assert sha2 != sha and generate(repo, out) == sha2  # a new commit, no reconfigure
    git(repo, "rm", "-q", "sub/b.txt")  # staged changes count
    assert generate(repo, out) == sha2 + "-dirty"


def test_generator_rewrites_only_on_change(repo, tmp_path):
    out = tmp_path / "latent_build_info.h"
    generate(repo, out)
    os.utime(out, ns=(1_000_000_000, 1_000_000_000))
    generate(repo, out)
    assert out.stat().st_mtime_ns == 1_000_000_000  # same value: untouched, nothing recompiles
    (repo / "a.txt").write_text("changed\n")
    generate(repo, out)
    assert out.stat().st_mtime_ns != 1_000_000_000


def test_generator_without_git(repo, tmp_path):
    out = tmp_path / "latent_build_info.h"
    assert generate(repo, out, git="") == "unknown"  # git not found at configure time
    assert generate(repo, out, git=str(tmp_path / "no-such-git")) == "unknown"  # git uninstalled since
    plain = tmp_path / "tarball"
    plain.mkdir()
    assert generate(plain, out) == "unknown"  # not a git work tree
    assert generate(repo / "sub", out) == "unknown"  # inside another repository: not ours to describe
