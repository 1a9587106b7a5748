"""A process's whole life: fork, interrupts, strict JAX settings (issue 44).

Each scenario depends on process state (the cache, its lock, threads, tracing), so each runs
in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

import pytest


def _run(code: str, timeout: float = 300) -> str:
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_fork_while_a_thread_holds_the_cache_does_not_hang_the_child():
    # Issue 44, reproduction 7: a fork while another thread was inside rotary's cache left the
    # child's first rotary call waiting forever on the cache's lock (held by a thread that does
    # not exist in the child).  Deterministic: a thread holds the lock while the process forks,
    # 100 times in a row; the child must answer, and answer right.
    _run(
        """
        import os, threading, time, warnings
        import numpy as np, rotary
        from rotary._lib import _cache
        warnings.simplefilter("ignore", DeprecationWarning)  # (fork with threads: the point here)
        x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
        for i in range(100):
            rotary.clear_cache()
            rotary.rotate(x, np.arange(5))
            want = rotary.rotate(x, np.arange(5) + i + 1)  # (the child's call: a new key)
            rotary.clear_cache()
            rotary.rotate(x, np.arange(5))
            held, release = threading.Event(), threading.Event()
            def hold():
                with _cache._CACHE._lock:
                    held.set()
                    release.wait()
            t = threading.Thread(target=hold)
            t.start()
            held.wait()
            pid = os.fork()
            if pid == 0:
                out = rotary.rotate(x, np.arange(5) + i + 1)
                again = rotary.rotate(x, np.arange(5) + i + 1)
                ok = np.array_equal(out, want) and np.array_equal(again, want)
                ok = ok and rotary.cache_info().nbytes > 0
                os._exit(0 if ok else 3)
            release.set()
            t.join()
            deadline = time.monotonic() + 30
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    raise SystemExit(f"run {i}: the forked child hung on rotary's cache")
                time.sleep(0.005)
            code = os.waitstatus_to_exitcode(status)
            assert code == 0, f"run {i}: the child exited with {code}"
        print("ok")
        """
    )


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_fork_while_a_thread_makes_a_librarys_first_call_never_hangs_the_child():
    # Issue 50, finding 6: a process forked while another thread made rotary's first torch call;
    # the child waited forever on the lock of a module that thread was importing (rotary's torch
    # backend; array_api_compat's wrapper).  Every import rotary makes after its own import is
    # taken under one lock that a fork waits for.  Here, for every installed library, fresh
    # processes (children of one that imported the libraries and rotary, and called nothing)
    # each start a thread making the library's first call and fork while it runs, 100 forks in
    # all; every grandchild must exit within the time limit, never hang.  Each makes rotary's
    # part of that first call (every import, up to a refused argument), then the whole call for
    # a fork-safe library, NumPy's for torch: torch is not fork-safe while another thread runs
    # its operations for the first time (it makes each operator's handle on its first call; a
    # fork inside that leaves the child waiting on it, outside rotary's reach).  JAX and Dask
    # are not fork-safe while another thread uses them (JAX's runtime, Dask's tokenize lock):
    # there the child makes NumPy's calls only.
    out = _run(
        """
        import importlib.util, os, random, signal, sys, threading, time, warnings
        warnings.simplefilter("ignore")  # (fork with threads, and JAX's word on it: the point here)
        import numpy as np
        FORKS, ROUNDS, LIMIT_S = 100, 4, 30
        NAMES = ("numpy", "torch", "jax", "dask", "array_api_strict")
        LIBS = [m for m in NAMES if importlib.util.find_spec(m)]
        SUB = {"jax": "jax.numpy", "dask": "dask.array"}
        mods = {m: importlib.import_module(SUB.get(m, m)) for m in LIBS}
        import rotary  # (no call yet: each round's process makes the first call of a library)

        def data(lib):
            # (made by the library's own operation: a library's first operation in a process
            # sets up state of its own, which a fork can catch half done, torch's CPU kernel
            # choice among it; a process with data has run its library before calling rotary)
            x = np.ones((2, 5, 8), np.float32)
            if lib == "torch":
                mods[lib].set_num_threads(1)
                return mods[lib].from_numpy(x) + 0
            if lib == "dask":
                return mods[lib].from_array(x, chunks=(1, 5, 8)) + 0
            return mods[lib].asarray(x) + 0

        def first_call(x):
            return rotary.rotate(x, np.arange(5))

        def child_calls(lib, x, whole):
            try:
                rotary.rotate(x, "not positions")  # (rotary's imports, then a refused argument)
            except TypeError:
                pass
            else:
                os._exit(4)
            first_call(whole)

        def round_(lib, forks):
            x = data(lib)
            mine = data("numpy" if lib in ("jax", "dask") else lib)
            whole = data("numpy" if lib in ("torch", "jax", "dask") else lib)
            t = threading.Thread(target=first_call, args=(x,))
            kids = []
            t.start()
            while len(kids) < forks:
                time.sleep(random.uniform(0, 0.004) if t.is_alive() else 0)
                pid = os.fork()
                if pid == 0:
                    signal.alarm(LIMIT_S + 30)  # (a hung child never outlives the test)
                    child_calls(lib, mine, whole)
                    os._exit(0)
                kids.append(pid)
            t.join()
            deadline = time.monotonic() + LIMIT_S
            for pid in kids:
                while True:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        code = os.waitstatus_to_exitcode(status)
                        if code:
                            return f"{lib}: a forked child exited with {code}"
                        break
                    if time.monotonic() > deadline:
                        for p in kids:
                            try:
                                os.kill(p, signal.SIGKILL)
                            except ProcessLookupError:
                                pass
                        return f"{lib}: a forked child hung (rotary's first {lib} call in another thread)"
                    time.sleep(0.002)
            return None

        per_lib, total = -(-FORKS // len(LIBS)), 0
        for lib in LIBS:
            for r in range(ROUNDS):
                n = per_lib // ROUNDS + (r < per_lib % ROUNDS)
                pid = os.fork()
                if pid == 0:
                    err = round_(lib, n)
                    if err:
                        print(err, flush=True)
                    os._exit(1 if err else 0)
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0, f"round {r} of {lib}"
                total += n
        print(total, len(LIBS))
        """
    )
    assert out.split()[0] == "100"


@pytest.mark.slow
def test_an_interrupt_at_any_bytecode_of_the_cache_or_its_keys_leaves_every_later_call_right():
    # Issue 44, reproduction 8: a KeyboardInterrupt between the two statements of the cache's
    # put stored an entry without counting its bytes.  Issue 50, finding 7: an exception raised
    # while a cache key was hashed or compared inside an OrderedDict operation (a configuration's
    # or a scaling's Python __hash__/__eq__ runs there) left the dict's links and table apart:
    # every later call raised KeyError until clear_cache().  Here an exception is raised at every
    # bytecode of the cache's code, and of every __hash__/__eq__ run while the cache is on the
    # stack (the keys' code inside its dict operations), in turn: KeyboardInterrupt and
    # MemoryError by turns, inside a call that hits, a call that stores, set_cache_limit and
    # clear_cache.  After each, the cache keeps nothing at limit 0, never reports negative bytes,
    # and every later call answers right.  Each operation's bytecodes are counted first, so the
    # sweep is exactly as long as the code it covers; it is deterministic: one pass is the same
    # as a hundred.
    out = _run(
        """
        import sys
        import numpy as np, rotary
        from rotary._lib import _cache
        CACHE_FILE = _cache.__file__
        KEY_CODE = ("__hash__", "__eq__")
        x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype(np.float32)
        ref = {n: rotary.rotate(x[:, :n], np.arange(n)) for n in range(1, 5)}

        class Stop(KeyboardInterrupt):
            pass

        class OutOfMemory(MemoryError):
            pass

        def in_cache(frame):
            while frame is not None:
                if frame.f_code.co_filename == CACHE_FILE:
                    return True
                frame = frame.f_back
            return False

        def interrupt_at(k, fn):
            \"\"\"Raise at the k-th bytecode run in the cache's code or in a key's code run inside
            it (k = 0: none, count them); whether it landed, and the count.\"\"\"
            count = [0]
            def local(frame, event, arg):
                if event == "opcode":
                    count[0] += 1
                    if count[0] == k:
                        raise (Stop if k % 2 else OutOfMemory)()
                return local
            def glob(frame, event, arg):
                code = frame.f_code
                if code.co_filename == CACHE_FILE or (code.co_name in KEY_CODE and in_cache(frame.f_back)):
                    frame.f_trace_opcodes = True
                    return local
                return None
            sys.settrace(glob)
            try:
                fn()
                landed = 0
            except (Stop, OutOfMemory):
                landed = 1
            finally:
                sys.settrace(None)
            return landed, count[0]

        def setup():
            rotary.clear_cache()
            rotary.set_cache_limit(64 * 2**20)
            for n in (1, 2):
                rotary.rotate(x[:, :n], np.arange(n))

        OPS = {
            "a call that hits": lambda: rotary.rotate(x[:, :2], np.arange(2)),
            "a call that stores": lambda: rotary.rotate(x[:, :3], np.arange(3)),
            "set_cache_limit": lambda: rotary.set_cache_limit(1000),
            "clear_cache": lambda: rotary.clear_cache(),
        }
        landed, bad, counts = 0, [], {}
        for name, op in OPS.items():
            setup()
            counts[name] = interrupt_at(0, op)[1]
            for k in range(1, counts[name] + 1):
                setup()
                landed += interrupt_at(k, op)[0]
                try:
                    if rotary.cache_info().nbytes < 0:
                        bad.append((name, k, "negative bytes", rotary.cache_info()))
                    for n in (2, 3, 4):
                        if not np.array_equal(rotary.rotate(x[:, :n], np.arange(n)), ref[n]):
                            bad.append((name, k, "wrong answer", n))
                    rotary.set_cache_limit(0)
                    info = rotary.cache_info()
                    if info.entries or info.nbytes:
                        bad.append((name, k, "limit 0 kept", info))
                except Exception as e:
                    bad.append((name, k, repr(e)[:200]))
        assert not bad, bad[:5]
        print(counts)
        print(landed)
        """
    )
    counts = ast.literal_eval(out.splitlines()[-2])  # (the bytecodes covered, per operation)
    assert all(n > 40 for n in counts.values()), counts
    assert int(out.split()[-1]) == sum(counts.values())  # (every interrupt landed)


@pytest.mark.parametrize("mode", ["raise", "warn"])
def test_jax_strict_rank_promotion_is_the_callers_setting_never_rotarys(mode):
    # Issue 44, reproduction 9: under jax_numpy_rank_promotion="raise" rotary failed inside its
    # own arithmetic (even with full-rank positions: fractional positions, dynamic NTK, float32
    # angles, linear attention); under "warn" it emitted the warnings.  Every public function of
    # the transform catalogue, and the options beside it, eager and under jit, must give the
    # bits it gives under "allow", with no warning.
    pytest.importorskip("jax")
    out = _run(
        f"""
        import sys, warnings
        sys.path.insert(0, "tests")
        import jax, jax.numpy as jnp, numpy as np, rotary
        from transforms import CASES
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((2, 3, 8, 16)), jnp.float32)
        pos = jnp.arange(8)
        dyn = rotary.RoPE(16, scaling=rotary.DynamicNTK(factor=2.0, max_position_embeddings=4))
        extra = {{
            "dynamic NTK": lambda: (dyn.rotate(x, pos),),
            "float32 angles, fractional": lambda: (rotary.rotate(x, pos * 0.5, angles="float32"),),
            "decay": lambda: (rotary.linear_attention(x, x, x, pos, causal=True, decay=0.9),),
            "gates": lambda: (rotary.linear_attention(
                x, x, x, pos, causal=True, log_gate=-0.1 * jnp.ones((2, 3, 8))),),
            "documents": lambda: (
                rotary.linear_attention(x, x, x, causal=True, cu_seqlens=jnp.array([0, 3, 8])),
                rotary.attention(x, x, x, causal=True, segment_ids=jnp.array([0, 0, 0, 1, 1, 1, 1, 1])),
            ),
            "state": lambda: tuple(rotary.linear_attention_state(x, x, pos)),
            "from_lengths": lambda: (rotary.positions.from_lengths(jnp.array([2, 3]), total=5),),
        }}
        cases = {{}}
        for name, case in CASES.items():
            if case.torch_only:
                continue
            inputs = {{k: jnp.asarray(v, jnp.float32 if v.dtype.kind == "f" else jnp.int32)
                       for k, v in case.make(np.random.default_rng(1)).items()}}
            cases[name] = (lambda c=case, i=inputs: c.fn(**i))
        cases.update(extra)
        def run_all():
            res = {{}}
            for name, f in cases.items():
                res[name] = [np.asarray(o) for o in f()]
                res[name + " jit"] = [np.asarray(o) for o in jax.jit(lambda f=f: f())()]
            return res
        want = run_all()
        rotary.clear_cache()
        jax.config.update("jax_numpy_rank_promotion", "{mode}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = run_all()
        rank = [str(w.message)[:100] for w in caught if "rank" in str(w.message)]
        assert not rank, rank[:3]
        for name in want:
            for a, b in zip(want[name], got[name], strict=True):
                assert np.array_equal(a, b), name
        # (the setting still polices the caller's own code)
        try:
            jnp.ones((2, 3)) + jnp.ones(3)
            policed = False
        except ValueError:
            policed = True
        assert policed == ("{mode}" == "raise")
        print(len(want))
        """
    )
    assert int(out.split()[-1]) > 40


def test_torch_inference_mode_keeps_its_memo_and_hands_nothing_to_grad_mode():
    # Issue 44, reproduction 11: under torch.inference_mode() nothing was memoised (a decoding
    # step about 4x slower than under no_grad: benchmarks/state.py's context rows).  Now the
    # checked signatures and decoding plans made there are kept; they hold no tensor of the call,
    # so a later call in grad mode gets ordinary tensors and its gradients.
    pytest.importorskip("torch")
    _run(
        """
        import torch, rotary
        from rotary._lib._cache import without
        rope = rotary.RoPE(64)
        g = torch.Generator().manual_seed(0)
        q, k = torch.randn(1, 8, 1, 64, generator=g), torch.randn(1, 2, 1, 64, generator=g)
        with without("signatures"):
            want = rope.apply(q, k, torch.tensor([40]))
        with torch.inference_mode():
            for _ in range(3):
                got = rope.apply(q, k, torch.tensor([40]))
                assert got[0].is_inference() and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        qq = q.clone().requires_grad_(True)
        out = rope.apply(qq, k, torch.tensor([40]))
        assert not out[0].is_inference() and out[0].requires_grad
        out[0].sum().backward()
        ref = qq.detach().clone().requires_grad_(True)
        with rotary.fast_paths(False):
            rope.apply(ref, k, torch.tensor([40]))[0].sum().backward()
        assert torch.equal(qq.grad, ref.grad)
        print("ok")
        """
    )


def test_jax_default_device_contexts_each_get_their_own_constants():
    # Issue 44, reproduction 11: inside jax.default_device(...) nothing was cached (each call
    # rebuilt its constants).  Constants are now kept there too, keyed by the default device:
    # one made inside a context is never handed to a call outside it, nor the other way.
    pytest.importorskip("jax")
    import os

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    code = """
        import jax, jax.numpy as jnp, numpy as np, rotary
        a, b = jax.devices("cpu")[:2]
        rope = rotary.RoPE(16)
        x = np.random.default_rng(0).normal(size=(2, 5, 16)).astype(np.float32)
        def dev_of(out):
            return next(iter(out.devices()))
        want = np.asarray(rope.rotate(jnp.asarray(x), np.arange(5) * 0.5))
        for round in range(3):
            for where in (b, None, a, b):
                if where is None:
                    out = rope.rotate(jnp.asarray(x), np.arange(5) * 0.5)
                    c, s = rope.cos_sin(np.arange(5) * 0.5, xp=jnp)
                    expect = jax.devices()[0]
                else:
                    with jax.default_device(where):
                        out = rope.rotate(jnp.asarray(x), np.arange(5) * 0.5)
                        c, s = rope.cos_sin(np.arange(5) * 0.5, xp=jnp)
                    expect = where
                assert dev_of(out) == expect and dev_of(c) == expect, (round, where, out.devices())
                assert np.array_equal(np.asarray(out), want)
        print(rotary.cache_info().entries)
        """
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=env
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
