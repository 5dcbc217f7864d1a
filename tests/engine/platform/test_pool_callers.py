"""The kernels' thread pool with two callers at once: MLX gives every Python thread its own stream,
so two threads evaluating at the same time (the engine thread and one preparing a request, say)
call the kernels from two stream threads concurrently. Each call must still finish and give the
bits it gives alone. Before the pool let one call own it at a time, the two calls shared its grain
counters and the first caller waited forever for grains nobody computed (a hung server at ``-t 2``).

One caller alone, calling back to back, must also never see a grain computed twice or by another
call: the pool once kept a call's grain count beside its generation word, so a worker finishing the
last grain of one call could read the next call's (larger) count before that call's generation was
posted, and claim a grain of the finished call. The caller then waited forever for a done count it
had passed, or the worker ran the finished call's destroyed job (a hang, or a crash, in about one
in seven short benchmark runs of a ``-t 2`` server). ``pool_check`` makes such calls in a loop.

The callers run in a child process, so a hang fails the test by its timeout instead of hanging the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import threading
    import mlx.core as mx
    import numpy as np
    from mlxcel.engine.platform import qmatmul

    qmatmul.set_threads(2)
    qmatmul.set_thread_split(1, 0)  # every call split among the threads, as finely as it goes
    rng = np.random.default_rng(0)
    n, k = 1536, 576
    raw = rng.integers(0, 256, size=(n, k // 32, 34), dtype=np.uint8)
    raw[:, :, 0:2] = (rng.standard_normal((n, k // 32)) * 0.02).astype(np.float16).view(np.uint8).reshape(
        n, k // 32, 2)
    w = qmatmul.pack_gguf(raw.reshape(n, -1), 8, n, k)  # Q8_0
    xs = [mx.array(rng.standard_normal((m, k)).astype(np.float32)) for m in (1, 8)]
    refs = [np.array(qmatmul.qmatmul(x, w)) for x in xs]
    wrong = []

    def loop(which):
        with mx.stream(mx.new_stream(mx.cpu)):
            x, ref = xs[which], refs[which]
            for _ in range(1500):
                y = qmatmul.qmatmul(x, w)
                mx.eval(y)
                if not np.array_equal(np.array(y), ref):
                    wrong.append(which)

    threads = [threading.Thread(target=loop, args=(i,)) for i in (0, 1, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done", len(wrong))
""")


def _child_says(code: str, what: str) -> list[str]:
    """The words ``code`` prints in a child process; a hang (the timeout) or a crash fails with ``what``."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} hung the thread pool") from None
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_two_threads_calling_the_kernels_at_once_finish_with_their_own_bits():
    assert _child_says(CHILD, "concurrent kernel calls") == ["done", "0"]


CHECK = textwrap.dedent("""
    from mlxcel.engine.platform import qmatmul

    qmatmul.set_threads(2)
    ext = qmatmul.extension()
    # spin 0: the caller is back at once (the race of the grain count); 50: the worker takes a share
    print("bad", sum(ext.pool_check(200_000, spin) for spin in (0, 50, 0, 50)))
""")


def test_back_to_back_calls_compute_every_grain_once():
    assert _child_says(CHECK, "back-to-back kernel calls") == ["bad", "0"]
