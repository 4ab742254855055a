"""How the parent reads a sandbox child's answers (``loaders.sandbox.Sandbox``): a JSON line, a
payload of the size it announces, and whatever follows, split exactly however the pipe cuts them."""
from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

from loaders.sandbox import Sandbox


def test_a_payload_of_many_pipe_chunks_arrives_whole_and_the_next_answer_after_it():
    payload = bytes(range(256)) * (40 << 10)                  # 10 MiB: 160 reads of a 64 KiB pipe
    r, w = os.pipe()
    box = Sandbox()
    box._proc = SimpleNamespace(stdout=SimpleNamespace(fileno=lambda: r))
    sent = b'{"ok": true, "payload": %d}\n' % len(payload) + payload + b'{"ok": true}\n'
    writer = threading.Thread(target=lambda: (os.write(w, sent[:1000]), os.write(w, sent[1000:])))
    writer.start()
    try:
        deadline = time.monotonic() + 60
        assert box._readline(deadline) == b'{"ok": true, "payload": %d}' % len(payload)
        got = box._read(len(payload), deadline)
        assert type(got) is bytes and got == payload
        assert box._readline(deadline) == b'{"ok": true}'
    finally:
        writer.join()
        os.close(w)
        os.close(r)
    box._proc = None
