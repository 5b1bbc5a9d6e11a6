"""Trusted child driver: answers framed JSON requests by calling one revision's `runtime` engine.

Run as a script (`python -I driver.py REVISION_ROOT RESPONSE_FD LOGITS_FD`), never imported by the
worker. Frames are a 4-byte big-endian length + UTF-8 JSON (worker/harness/frames.py), both ways.
Logits are written raw (float32) into the shared memory the parent allocated (LOGITS_FD); the
parent reads and reduces them itself, so no number this process computes is trusted.
It must stay self-contained: stdlib, plus torch/numpy only when the revision's runtime brought
them in, plus the revision's own `runtime` package from REVISION_ROOT — importing worker/ or the
deployed runtime here would let the two revisions' modules clash.

Nothing this process says about time is used: the parent times each request from outside. The
driver synchronises the device before answering so that the parent's clock covers the work.
Revision code's own stdout is redirected to stderr so it cannot forge protocol lines casually.
"""
import array
import hashlib
import json
import mmap
import os
import struct
import sys
import traceback

DRIVER_VERSION = 7
_HEADER = struct.Struct(">I")


def _live_cuda():
    """torch, where this process has a CUDA context already (never starts one), else None."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch
    return None


def _read_frame(stream):
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack(head)
    return json.loads(stream.read(n))


def _write_frame(fd, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    _write_all(fd, _HEADER.pack(len(data)) + data)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _tail(text, n=4000):
    return text[-n:]


def _classify(exc):
    name = type(exc).__name__
    msg = str(exc)
    if isinstance(exc, MemoryError) or name == "OutOfMemoryError" or "out of memory" in msg.lower():
        return "oom"
    return "error"


def _to_list(x):
    if hasattr(x, "detach"):
        x = x.detach().float().cpu()
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _copy_row(out):
    if hasattr(out, "detach"):
        t = out.detach().reshape(-1)
        return t.clone() if str(t.dtype) == "torch.float32" else t.float()  # one copy either way
    import numpy as np

    return np.array(out, dtype=np.float32).reshape(-1)


def _copy_spans(n, pinned):
    """[start, end) element spans for copying n values into the shared buffer whose first `pinned` are
    page-locked: CUDA refuses, whole, a copy that runs past a registered range (cudaErrorInvalidValue,
    seen on the H200 when the accuracy phase put 256 rows after 64 were pinned), so none crosses it."""
    k = min(n, max(pinned, 0))
    return [(0, k), (k, n)] if 0 < k < n else [(0, n)]


def _clear_cuda_error():
    """Read (and so clear) the CUDA runtime's pending error after a refused cudaHostRegister: torch's
    binding leaves it set, and the next kernel launch would raise it as its own. Through the very
    libcudart this process loaded (its path from /proc/self/maps: another copy has its own state)."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
        for path in paths:
            ctypes.CDLL(path).cudaGetLastError()
    except OSError:
        pass


def _unmask(staged, seed, vocab, torch):
    """The staged ids of a timed prompt, unmasked with the seed its timed request brought: staged = (ids + k)
    mod vocab, k = SHAKE-256(seed) as little-endian uint32 mod vocab (worker/harness/masking.py), so
    nothing of the prompt was known before this request (its answers cannot be computed in `stage`)."""
    raw = hashlib.shake_256(bytes.fromhex(seed)).digest(4 * len(staged))
    if torch is not None and hasattr(staged, "dtype"):
        # native int32 = little-endian: the sandbox runs only on x86_64 and aarch64 (worker/sandbox/seccomp.py)
        k = torch.frombuffer(bytearray(raw), dtype=torch.int32).to(torch.int64) & 0xFFFFFFFF
        return (staged - k % vocab) % vocab
    k = array.array("I")
    k.frombytes(raw)
    if sys.byteorder == "big":
        k.byteswap()
    return [(int(m) - x) % vocab for m, x in zip(staged, k)]


def _accepts(fn, name):
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _stack(rows):
    if hasattr(rows[0], "detach"):
        import torch

        return torch.stack(rows)
    import numpy as np

    return np.stack(rows)


class Driver:
    def __init__(self, root, shm=None):
        self.root = root
        self.shm = shm
        self.runtime = None
        self.engine = None
        self.staged = {}
        self.torch = None
        self.pinned = 0  # bytes of the shared buffer page-locked for the GPU (pin_logits)

    # -- requests ---------------------------------------------------------------------------
    def hello(self, req):
        sys.path.insert(0, self.root)
        try:
            import runtime  # the revision's own package, from its worktree only
        except BaseException as exc:  # noqa: BLE001 - any import failure is the revision's
            return {"ok": False, "kind": "import", "error": f"{type(exc).__name__}: {exc}",
                    "trace": _tail(traceback.format_exc())}
        origin = os.path.realpath(getattr(runtime, "__file__", "") or "")
        if not origin.startswith(os.path.realpath(self.root) + os.sep):
            return {"ok": False, "kind": "import", "error": f"runtime imported from {origin}, not {self.root}"}
        if not callable(getattr(runtime, "load_engine", None)):
            return {"ok": False, "kind": "protocol", "error": "runtime.load_engine is missing"}
        self.runtime = runtime
        self.torch = sys.modules.get("torch")
        return {"ok": True, "runtime_file": origin, "protocol": getattr(runtime, "PROTOCOL_VERSION", None),
                "python": sys.version.split()[0],
                "torch": getattr(self.torch, "__version__", None),
                "triton": getattr(sys.modules.get("triton"), "__version__", None),
                "driver": DRIVER_VERSION}

    def load(self, req):
        self.unload(req)  # a second model replaces the first: free it (and its cached GPU blocks) before loading
        try:
            self.engine = self.runtime.load_engine(req["path"], device=req["device"],
                                                   max_context=req["max_context"], backend=req["backend"])
        except TypeError as exc:
            return {"ok": False, "kind": "protocol", "error": f"load_engine signature: {exc}",
                    "trace": _tail(traceback.format_exc())}
        self.torch = sys.modules.get("torch")
        missing = [m for m in ("prefill", "decode", "generate_greedy", "reset", "synchronize")
                   if not callable(getattr(self.engine, m, None))]
        if missing:
            return {"ok": False, "kind": "protocol", "error": f"engine lacks {', '.join(missing)}"}
        vocab = getattr(getattr(self.engine, "config", None), "vocab_size", None)
        if not isinstance(vocab, int) or vocab <= 0:
            return {"ok": False, "kind": "protocol", "error": f"engine.config.vocab_size is {vocab!r}"}
        self.vocab = vocab
        pin = self.pin_logits({"rows": req.get("pin_rows") or 0})
        return {"ok": True, "vocab_size": vocab, "memory": self._memory(), "pinned": pin,
                "torch": getattr(self.torch, "__version__", None),
                "triton": getattr(sys.modules.get("triton"), "__version__", None)}

    def stage(self, req):
        ids = [int(t) for t in req["ids"]]
        self.staged[req["key"]] = self.torch.tensor(ids, dtype=self.torch.long) if self.torch else ids
        return {"ok": True, "n": len(ids)}

    def prefill(self, req):
        """Timed: the prompt's last-position logits land in shared memory inside the timed request. A timed
        prompt was staged masked; `unmask` (its seed) comes only now."""
        ids = self.staged[req["key"]]
        if req.get("unmask"):
            ids = _unmask(ids, req["unmask"], self.vocab, self.torch)
        self.engine.reset()
        out = self.engine.prefill(ids)
        self.engine.synchronize()
        shape = self._put(out)
        if len(shape) != 1 and shape[:1] != [1]:
            return {"ok": False, "kind": "protocol", "error": f"prefill returned logits of shape {shape}"}
        return {"ok": True, "shape": shape}

    def generate(self, req):
        """Timed: `decode(lead)`, then greedy ids; with `step_logits`, every greedy step's logits too, written
        into the parent's shared memory inside the timed request (rows n x vocab; `steps` says how many the
        revision's generate_greedy produced through engine.decode: 0 when it bypasses it).

        `lead`: a token the parent drew in secret and sends only now; the continuation starts from it, so no
        decode step could be done before this request (in an untimed prefill, or after any prefill's answer).
        Its decode is called here, before the step hook goes on: only generate_greedy's own decodes count."""
        n = int(req["n"])
        steps = []
        engine = self.engine
        if req.get("lead") is not None:
            engine.decode(int(req["lead"]))
        if req.get("step_logits") and self.torch is not None and _accepts(engine.generate_greedy, "logits_out"):
            return self._generate_into(n)
        hooked = bool(req.get("step_logits")) and hasattr(engine, "__dict__")
        if hooked:
            own = vars(engine).get("decode")  # an instance attribute of its own, put back after
            inner = engine.decode

            def decode(token_id, _inner=inner):
                out = _inner(token_id)
                steps.append(_copy_row(out))  # a copy: the engine may reuse its logits buffer
                return out

            vars(engine)["decode"] = decode
        try:
            ids = engine.generate_greedy(n)
        finally:
            if hooked:
                if own is not None:
                    vars(engine)["decode"] = own
                else:
                    vars(engine).pop("decode", None)
        self.engine.synchronize()
        ids = _to_list(ids)
        if len(ids) != n or not all(isinstance(t, (int, float)) and float(t).is_integer() for t in ids):
            return {"ok": False, "kind": "protocol",
                    "error": f"generate_greedy({req['n']}) returned {str(ids)[:200]}"}
        resp = {"ok": True, "ids": [int(t) for t in ids], "steps": len(steps)}
        if steps and len(steps) == n:
            resp["shape"] = self._put(_stack(steps))
        return resp

    def logits(self, req):
        """All-position logits of a staged prompt, written as raw float32 for the parent to read;
        with `hold`, kept here instead (a long prompt's are GBs) until `rows` says which to send."""
        self.held = None
        self.engine.reset()
        out = self.engine.prefill(self.staged[req["key"]], all_logits=True)
        self.engine.synchronize()
        n = len(self.staged[req["key"]])
        shape = [int(x) for x in getattr(out, "shape", ())]
        if shape != [n, self.vocab]:
            return {"ok": False, "kind": "protocol", "error": f"all_logits shape {shape}, expected [{n}, {self.vocab}]"}
        if req.get("hold"):
            self.held = out
            return {"ok": True, "held": shape}
        return {"ok": True, "shape": self._put(out)}

    def rows(self, req):
        """The held logits' rows at the positions the parent chose after the prefill, into shared memory."""
        held, self.held = getattr(self, "held", None), None
        if held is None:
            return {"ok": False, "kind": "protocol", "error": "rows requested with no held logits"}
        pos = [int(i) for i in req["rows"]]
        if hasattr(held, "detach"):
            import torch

            picked = held[torch.tensor(pos, dtype=torch.long, device=held.device)]
        else:
            picked = held[pos]
        shape = self._put(picked)
        del held, picked
        torch = _live_cuda()
        if torch is not None:
            torch.cuda.empty_cache()  # a long prompt's logits are GBs: hand them back before timing
        return {"ok": True, "shape": shape}

    def _put(self, out):
        """Raw float32 values of `out` into the parent's shared memory at offset 0, in ONE copy
        (device or array → the shared pages); returns the shape. Through host temporaries it took 3
        copies, which inside a timed generate cost 0.8B decode +46 % of its time
        (gpu-checks-h200-20261202T174227Z.json) and their page faults are noise in every timing."""
        if hasattr(out, "detach"):
            import torch

            src = out.detach()
            shape, n = [int(x) for x in src.shape], int(src.numel())
            if n * 4 > len(self.shm):
                raise MemoryError(f"logits of shape {shape} exceed the shared buffer")
            dst = torch.frombuffer(self.shm, dtype=torch.float32, count=n)
            flat = src.reshape(-1)
            try:  # each pass converts the dtype and moves device → host
                for a, b in _copy_spans(n, self.pinned // 4):
                    dst[a:b].copy_(flat[a:b])
            finally:
                del dst  # the view pins the mapping
            return shape
        import numpy as np  # a numpy-only runtime returns arrays

        arr = np.asarray(out, dtype=np.float32)
        shape = list(arr.shape)
        if arr.size * 4 > len(self.shm):
            raise MemoryError(f"logits of shape {shape} exceed the shared buffer")
        dst = np.frombuffer(self.shm, dtype=np.float32, count=arr.size)
        try:
            dst[:] = arr.reshape(-1)
        finally:
            del dst
        return shape

    def _generate_into(self, n):
        """An engine whose generate_greedy bypasses engine.decode (a graph-captured loop) may take
        `logits_out`, an n x vocab float32 device buffer it fills with each step's logits. NaN until
        written, so rows it leaves unwritten cannot pass the parent's check. (The lead is decoded already.)"""
        torch = self.torch
        buf = torch.full((n, self.vocab), float("nan"), dtype=torch.float32,
                         device=getattr(self.engine, "device", "cpu"))
        ids = _to_list(self.engine.generate_greedy(n, logits_out=buf))
        self.engine.synchronize()
        if len(ids) != n or not all(isinstance(t, (int, float)) and float(t).is_integer() for t in ids):
            return {"ok": False, "kind": "protocol", "error": f"generate_greedy({n}) returned {str(ids)[:200]}"}
        return {"ok": True, "ids": [int(t) for t in ids], "steps": n, "shape": self._put(buf)}

    def teacher_logits(self, req):
        """Teacher-forced logits for emitted ids: row 0 the prompt's last position, row i+1 after
        decode(emitted[i]); (len(emitted)+1) x vocab float32 into the parent's shared memory."""
        self.engine.reset()
        rows = [_copy_row(self.engine.prefill(self.staged[req["key"]]))]
        for t in [int(t) for t in req["emitted"]]:
            rows.append(_copy_row(self.engine.decode(t)))
        return {"ok": True, "shape": self._put(_stack(rows))}

    def teacher(self, req):
        """Teacher-forced check rows for emitted ids: [logit of the emitted id, max logit, argmax]."""
        self.engine.reset()
        out = self.engine.prefill(self.staged[req["key"]])
        rows = []
        emitted = [int(t) for t in req["emitted"]]
        for i, t in enumerate(emitted):
            vals = out.detach().float().reshape(-1) if hasattr(out, "detach") else out
            rows.append([float(vals[t]), float(vals.max()), int(vals.argmax())])
            if i + 1 < len(emitted):
                out = self.engine.decode(t)
        return {"ok": True, "rows": rows}

    def memory(self, req):
        return {"ok": True, "memory": self._memory()}

    def unload(self, req):
        """Drop the model and hand its memory back. The first process pair is done with a model once its sweep is
        verified, while fresh pairs (confirmation, the A/A sentinel) load theirs beside it and the reference: on an
        80 GB card the 9B's five processes did not fit (the reference alone holds ~40 GiB in verify)."""
        self.engine, self.held = None, None
        self.staged.clear()
        import gc

        gc.collect()
        torch = _live_cuda()
        if torch is not None:
            torch.cuda.empty_cache()
        return {"ok": True}

    def pin_logits(self, req):
        """Page-lock the first `rows` x vocab float32 of the shared buffer for the GPU (cudaHostRegister;
        rows 0 unlocks it). A timed generate's per-step logits (64 x 248k = 64 MB) then move by DMA
        with no page faults. Into pageable pages they cost +2.9 % (9B) / +6.6 % (0.8B) of a generate and
        up to 0.84 % within-pair sd on the H200; pinned +1.0 / +2.2 % and 0.06-0.19 %, as with no copy
        (bench/receipts/decode-noise-20261203T115546Z.json). Never fatal: a box that refuses keeps the
        pageable copy and says why."""
        torch = self.torch
        rows = int(req.get("rows") or 0)
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {"ok": True, "bytes": 0, "cuda": False, "why": "no CUDA in this process"}
        import ctypes

        cudart = torch.cuda.cudart()
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.shm))
        if self.pinned:
            cudart.cudaHostUnregister(ptr)
            self.pinned = 0
        size = min(len(self.shm), -(-rows * self.vocab * 4 // mmap.PAGESIZE) * mmap.PAGESIZE)
        if size <= 0:
            return {"ok": True, "bytes": 0}
        err = cudart.cudaHostRegister(ptr, size, 0)
        if int(getattr(err, "value", err)) != 0:
            _clear_cuda_error()
            return {"ok": True, "bytes": 0, "why": f"cudaHostRegister: {err}"[:200]}
        self.pinned = size
        return {"ok": True, "bytes": size}

    # -- helpers -----------------------------------------------------------------------------
    def device_sync(self):
        """Synchronise CUDA ourselves too: the engine's own synchronize() is revision code."""
        torch = _live_cuda()
        if torch is not None:
            torch.cuda.synchronize()

    def _memory(self):
        try:
            stats = self.engine.memory_stats()
            return {k: (int(v) if isinstance(v, (int, float)) else None) for k, v in dict(stats).items()}
        except Exception as exc:  # noqa: BLE001 - optional, reported as unknown
            return {"error": f"{type(exc).__name__}: {exc}"}



def main():
    root, fd, shm_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    shm = mmap.mmap(shm_fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.dup2(2, 1)  # revision prints go to stderr, never onto the protocol channel
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    driver = Driver(root, shm)
    while True:
        req = _read_frame(stdin)
        if req is None:
            break
        op = req.get("op")
        if op == "exit":
            _write_frame(fd, {"ok": True, "seq": req.get("seq")})
            break
        try:
            resp = getattr(driver, op)(req)
            if op in ("prefill", "generate", "logits", "teacher", "teacher_logits"):
                driver.device_sync()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which classifies it
            resp = {"ok": False, "kind": _classify(exc), "error": f"{type(exc).__name__}: {exc}"[:2000],
                    "trace": _tail(traceback.format_exc())}
        resp["seq"] = req.get("seq")  # the parent rejects answers out of sequence
        _write_frame(fd, resp)
    os.close(fd)
    # Nothing is measured after this: skip the interpreter's teardown (torch's and CUDA's destructors took
    # ~1.2 s per process, paid twice per process pair); the kernel frees everything and the parent still
    # reads the tree's CPU time from its cgroup.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
