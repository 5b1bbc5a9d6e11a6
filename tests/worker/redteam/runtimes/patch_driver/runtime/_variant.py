"""Patching the trusted driver from inside: fast cached answers, forged fields, a rewritten frame writer."""
from ._honest import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


def on_load():
    import sys
    main = sys.modules["__main__"]
    Driver = main.Driver

    def prefill(self, req):
        """Fast and wrong: only the prompt's last token goes through the model (state stays usable)."""
        ids = self.staged[req["key"]]
        self.engine.reset()
        out = self.engine.prefill(ids[-1:])
        resp = {"ok": True, "shape": self._put(out), "tok_s": 1e9, "elapsed": 1e-9}
        return resp

    Driver.prefill = prefill
    real_write = main._write_frame

    def write(fd, obj):
        obj.update(seconds=1e-9, cpu_s=0.0)  # (a forged vocab_size is forge_hello's: a protocol fault)
        return real_write(fd, obj)

    main._write_frame = write
