"""Where the CPU of an uncached 720p image goes, in process (no server): JPEG decode, the streamed
resize + patchify + base64 (`process`, what a response carries) against the whole-image path it
replaced (planes, patch rows, base64 pieces and their join), and one request's 4 images on 1 thread
against 2 (`ImageBatch`'s helper threads: what the idle cores of the worker pool give a request).

    python3 -m benchmarks.mm_pipeline_bench [--rounds 60]

Each variant runs once per round, interleaved, so drift in the machine's load hits them alike;
CPU is the process's CPU time (time.process_time), wall is perf_counter; p10 and median over rounds.
The images are mm_bench's 1280x720 JPEGs (resized to 704x1280: the height pass only)."""

from __future__ import annotations

import argparse
import base64
import itertools
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.mm_bench import fill, jpeg_template
from render_service.multimodal import b64stream, turbo_jpeg
from render_service.multimodal import qwen3_vl as multimodal
from tests.parity.mm_corpus import MM_MODEL_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    config = multimodal.VisionConfig(
        model_id=MM_MODEL_DIR,
        image_token_id=151655,
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=65536,
        max_pixels=16777216,
    )
    jpegs = [base64.b64decode(fill(jpeg_template(seed), seed).split(",", 1)[1]) for seed in range(101, 105)]
    pixels = turbo_jpeg.decode(multimodal._open(jpegs[0], 10**9), jpegs[0])
    assert pixels is not None
    streamed_available = b64stream.available()

    def decode() -> None:
        turbo_jpeg.decode(multimodal._open(jpegs[0], 10**9), jpegs[0])

    def streamed() -> None:
        multimodal.process(pixels, config, "x")

    def whole_image() -> None:
        planes = multimodal.resize_planar(pixels, 704, 1280)
        rows, gh, gw = multimodal.patchify(planes, 16, 2, 2)
        multimodal._json_b64_msgpack(multimodal._item(gh, gw, rows.shape[1]), rows)

    def one(data: bytes) -> None:
        decoded = turbo_jpeg.decode(multimodal._open(data, 10**9), data)
        assert decoded is not None
        multimodal.process(decoded, config, "x")

    pool = ThreadPoolExecutor(1)

    def four(threads: int) -> Callable[[], None]:
        def run() -> None:
            turns = itertools.count()

            def work() -> None:
                while (index := next(turns)) < len(jpegs):
                    one(jpegs[index])

            helpers = [pool.submit(work) for _ in range(threads - 1)]
            work()
            for helper in helpers:
                helper.result()

        return run

    assert multimodal.process(pixels, config, "x").kwargs_json == _whole_bytes(pixels, config)
    variants: dict[str, Callable[[], None]] = {
        "decode (simplejpeg)": decode,
        "process, streamed bands": streamed,
        "process, whole image + join": whole_image,
        "4 images, 1 thread": four(1),
        "4 images, 2 threads": four(2),
    }
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm-up: plans, caches, the heap
    for _ in range(args.rounds):
        for name, fn in variants.items():
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append((time.perf_counter() - w0) * 1000)
            cpu[name].append((time.process_time() - c0) * 1000)
    print(f"streamed path available: {streamed_available}; {args.rounds} interleaved rounds")
    print(f"{'variant':30s} {'CPU p10':>8s} {'CPU p50':>8s} {'wall p10':>9s} {'wall p50':>9s}")
    for name in variants:
        print(
            f"{name:30s} {np.percentile(cpu[name], 10):8.2f} {statistics.median(cpu[name]):8.2f} "
            f"{np.percentile(wall[name], 10):9.2f} {statistics.median(wall[name]):9.2f}"
        )
    one_thread, two_threads = (
        statistics.median(wall["4 images, 1 thread"]),
        statistics.median(wall["4 images, 2 threads"]),
    )
    print(f"4 images: 2 threads take {two_threads / one_thread:.2f} of 1 thread's wall time")


def _whole_bytes(pixels: np.ndarray, config: multimodal.VisionConfig) -> bytes:
    planes = multimodal.resize_planar(pixels, 704, 1280)
    rows, gh, gw = multimodal.patchify(planes, 16, 2, 2)
    return multimodal._json_b64_msgpack(multimodal._item(gh, gw, rows.shape[1]), rows)


if __name__ == "__main__":
    main()
