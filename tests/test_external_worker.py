"""The worker process's pipe: a worker that died with a request still in quantkit's buffer."""

import sys

from quantkit.external.worker import Worker


def test_closing_a_dead_worker_with_an_unsent_request_is_quiet(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    script = tmp_path / "exits.py"
    script.write_text("import sys\nsys.exit(0)\n")
    w = Worker.start(sys.executable, script, env={}, what="toy worker")
    w.proc.wait(timeout=30)
    w.proc.stdin.write(b'{"op": "never read"}\n')  # buffered, unsent: closing the pipe flushes it
    w.close()
    assert w.proc.stdin.closed and not w.tmp.exists()
