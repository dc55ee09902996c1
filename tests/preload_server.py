"""Fork server for the harness tests' nested runs (tests/preloaded_python.py is its client).

Run as a script, without PYTHONPATH: it imports the third-party libraries every nested harness run
imports (torch, transformers and the Hugging Face model modules the cases build, torch.export's
tracer), then forks one child per request. The child takes the request's working directory,
environment, ``sys.path`` and ``sys.argv`` and runs ``python -m <module> <args>`` from there, so it
differs from a fresh interpreter only in having those libraries imported already. Nothing of this
project (tico, harness, cases, tests) is imported before the fork: a run on a tico copy imports
that copy. Protocol: one JSON line per request on stdin; JSON lines back on stdout.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import sys
import traceback

PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.export",
    "torch.fx.experimental.symbolic_shapes",
    "sympy",
    "numpy",
    "transformers",
    "transformers.cache_utils",
    "transformers.models.gemma4.modeling_gemma4",
    "transformers.models.gemma4_assistant.modeling_gemma4_assistant",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3_vl.modeling_qwen3_vl",
    "safetensors.torch",
    "jinja2",
    # what tico and the harness import from outside them, and pytest's own modules (not its plugins:
    # a plugin imported before pytest starts is not assertion-rewritten)
    "circle_schema",
    "flatbuffers",
    "torch.ao.quantization.fx",
    "torch.ao.quantization.fx._decomposed",
    "coverage",
    "tabulate",
    "execnet",
    "pygments.lexers.python",
    "pytest",
    "_pytest.pytester",
)
# transformers imports anyio, which is also a pytest plugin: pytest cannot rewrite the asserts of a plugin
# imported before it starts, and says so in a config-time warning that a fresh interpreter does not print
# (only pytest's own -W option reaches that warning).
_PRELOADED_PLUGIN_WARNING = (
    "-W",
    "ignore:Module already imported so cannot be rewritten; anyio:pytest.PytestAssertRewriteWarning",
)


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _thread_count() -> int:
    """Threads of this process, native ones included: forking is only safe with one."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown: the client then runs every request as a plain subprocess


def _run_child(request: dict, base_path: list[str]) -> None:
    """In the forked child: become ``python -m module args`` in the request's directory and environment.
    Ends the process through normal interpreter shutdown (atexit handlers run, as in a fresh one)."""
    os.setpgid(0, 0)  # the client stops the child and whatever it started as one group
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)  # replaces the server's request and reply pipes in the child
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *base_path]
    importlib.invalidate_caches()
    extra_args = _PRELOADED_PLUGIN_WARNING if request["module"] == "pytest" else ()
    sys.argv = [request["module"], *extra_args, *request["args"]]
    code: object = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
    except BaseException:  # noqa: BLE001 - reported as a fresh interpreter would, on stderr with exit 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def main() -> None:
    base_path = sys.path[1:]  # a fresh `python -m` puts its directory first, then what this one has
    sys.path[:] = base_path  # this script's directory (tests/) never shadows a library the preload imports
    for name in PRELOAD:
        importlib.import_module(name)
    threads = _thread_count()
    _reply({"ready": threads == 1, "threads": threads})
    if threads != 1:
        return
    # The preloaded objects live as long as any child: the children's collector then neither walks them
    # nor touches (and so copies) their pages, which halved a child's run and exit.
    gc.freeze()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(request, base_path)
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
