"""A fork server for running ``flowsearch`` commands as real processes, cheaply.

A fresh ``python -m flowsearch.cli`` spends seconds importing torch and transformers before it
does anything (15 s on a loaded 2-core machine), which would put the crash trials far outside a
fast suite. This server imports them once and forks a child per command: the child is a real
process with its own pid, stdout/stderr files and exit code, running ``flowsearch.cli.main``
exactly as the console script does, so it can be SIGKILLed or SIGINTed at any moment. The parent
never runs a torch op (no thread pools exist at fork time).

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout.
``{"run": argv, "cwd": dir, "out": file, "err": file, "env": {...}}`` -> ``{"pid": n}``;
``{"wait": pid, "timeout": s}`` -> ``{"status": code}`` (-signal when killed; ``timeout``
kills the child first).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback


def _preload() -> None:
    import duckdb  # noqa: F401
    import faiss  # noqa: F401
    import flowsearch.writes.rewrite  # noqa: F401
    import pyarrow.csv  # noqa: F401
    import pyarrow.json  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoModel, AutoTokenizer, BertModel  # noqa: F401

    import flowsearch.cli  # noqa: F401
    import flowsearch.lexical.bm25  # noqa: F401
    import flowsearch.search.searcher  # noqa: F401
    import flowsearch.writes.build  # noqa: F401


def _child(req: dict) -> None:
    """In the forked child: redirect, run the CLI, exit with its code (never returns)."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own group: a signal to it reaches no one else
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        fd_in = os.open(os.devnull, os.O_RDONLY)
        fd_out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fd_err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd_in, 0)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        os.environ.update(req.get("env") or {})
        os.chdir(req.get("cwd") or os.getcwd())
        sys.argv = ["flowsearch", *req["run"]]
        from flowsearch.cli import main

        try:
            code = main(req["run"])
        except SystemExit as exc:  # as the interpreter would
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()  # what an uncaught exception prints
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)


def serve() -> None:
    _preload()
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if "run" in req:
            out.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req)
            answer: dict = {"pid": pid}
        elif "wait" in req:
            answer = {"status": _wait(int(req["wait"]), float(req.get("timeout", 120)))}
        else:
            answer = {"error": f"bad request {req!r}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
