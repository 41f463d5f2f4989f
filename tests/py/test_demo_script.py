"""scripts/demo's own logic, without building: the free-port finder it uses (scripts/free_port) and its argument
checks, which run before anything is installed or built."""
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FREE_PORT = ROOT / "scripts" / "free_port"
DEMO = ROOT / "scripts" / "demo"


def free_port(*args):
    p = subprocess.run([str(FREE_PORT), *map(str, args)], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout.strip(), p.stderr


def listening(reuseport=False):
    s = socket.socket()
    if reuseport:  # as cpp-httplib does: a second SO_REUSEPORT server could bind the same port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_taken_port_is_skipped():
    for reuse in (False, True):
        with listening(reuse) as s:
            taken = s.getsockname()[1]
            rc, out, err = free_port(taken)
            assert rc == 0, err
            port = int(out)
            assert port != taken and bindable(port)


def test_free_port_is_kept():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out, _ = free_port(port)  # closed again: free (unless another process grabbed it in between)
    assert rc == 0 and (int(out) == port or not bindable(port))


def test_all_taken_falls_back_to_any_free_port():
    with listening() as s:
        taken = s.getsockname()[1]
        rc, out, _ = free_port(taken, "--tries", 0)
        assert rc == 0 and int(out) != taken and bindable(int(out))


def test_free_port_bad_arguments():
    for bad in ["abc", "0", "70000"]:
        rc, _, err = free_port(bad)
        assert rc == 2 and "1..65535" in err


def demo(*args):
    return subprocess.run(["bash", str(DEMO), *args], capture_output=True, text=True, timeout=60)


def test_demo_argument_errors():
    for args, needle in [(["--port", "abc"], "--port must be a number"), (["--port", "0"], "1..65535"),
                         (["--port"], "--port needs a number"), (["--bogus"], "unknown option '--bogus'"),
                         (["one", "two"], "one question at a time")]:
        p = demo(*args)
        assert p.returncode == 1 and needle in p.stderr and "setup" not in p.stderr, (args, p.stderr)


def test_demo_help():
    p = demo("--help")
    assert p.returncode == 0 and "scripts/demo [--port N]" in p.stdout and "free one" in p.stdout
