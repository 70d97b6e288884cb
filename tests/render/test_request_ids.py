"""Generated request ids (`pipeline.random_uuid`): vLLM's format, unique, and never repeated by
a forked worker from the bytes its parent had read ahead."""

from __future__ import annotations

import os
import re

from render_service.render.pipeline import random_uuid


def test_ids_have_vllms_format_and_do_not_repeat() -> None:
    ids = [random_uuid() for _ in range(3000)]  # past one batch of read-ahead bytes
    assert len(set(ids)) == len(ids)
    # uuid4's low half: 16 hex digits, the first carrying the RFC 4122 variant bits (8, 9, a, b)
    assert all(re.fullmatch(r"[89ab][0-9a-f]{15}", value) for value in ids)


def test_a_forked_child_does_not_reuse_the_parents_bytes() -> None:
    random_uuid()  # the parent has bytes read ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        os.write(write, " ".join(random_uuid() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    os.waitpid(pid, 0)
    parent = [random_uuid() for _ in range(4)]
    assert len(child) == 4 and not set(child) & set(parent)
