#!/usr/bin/env python3
"""scripts/trace-chain.py on a trace of known times: 20 replays of a recorded step (a graph's
nodes keep their %gridid), written into a ring smaller than the trace so that it wraps and the
oldest step is cut. The chain time of each kernel and the step's must come out as built."""
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
REC = np.dtype([("grid", "<u8"), ("arrive", "<u8"), ("go", "<u8"), ("block", "<u4"),
                ("sm", "<u4"), ("blocks", "<u4"), ("threads", "<u4")])
# (blocks, threads, us from its go to the next kernel's) of a layer, and of a step
LAYER = [(8, 256, 4.5), (384, 128, 3.5), (16, 128, 3.0), (8, 128, 5.5), (512, 128, 3.5),
         (8, 256, 4.5), (1792, 128, 23.5), (56, 256, 3.0), (512, 128, 12.5)]
STEP = [(2, 64, 3.0)] + LAYER * 4 + [(8, 256, 4.5), (8016, 128, 150.0)]


def main():
    recs, t = [], 10**12
    for _ in range(20):
        for node, (blocks, threads, us) in enumerate(STEP):
            for b in range(blocks):  # waves of 132 blocks, a wave a microsecond after the last
                recs.append((1000 + node, t - 2000, t + 1000 * (b // 132), b, b % 132, blocks,
                             threads))
            t += int(us * 1000)
    rec = np.array(recs, dtype=REC)
    cap = 1 << 17  # fewer than the records: the ring wraps
    ring = np.zeros(cap, dtype=REC)
    ring[np.arange(len(rec)) % cap] = rec
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "t.bin"
        path.write_bytes(b"KVSTRACE" + np.array([len(rec), cap], "<u8").tobytes() +
                         ring.tobytes())
        out = subprocess.run([sys.executable, ROOT / "scripts/trace-chain.py", path],
                             capture_output=True, text=True, check=True).stdout
    print(out)
    step_us = sum(s[2] for s in STEP)
    assert f"{step_us:.1f} us a step" in out, out
    assert "4 layers of 9 kernels from launch 1" in out, out
    rows = [l.split("|") for l in out.splitlines() if l.startswith("| layer ")]
    assert len(rows) == len(LAYER), rows
    for row, (blocks, threads, us) in zip(rows, LAYER):
        assert row[2].strip() == f"{blocks} x {threads}", row
        assert abs(float(row[3]) - us) < 1e-6, row  # chain
        assert abs(float(row[4]) - 2.0) < 1e-6, row  # early: arrived 2 us before its go
        assert abs(float(row[5]) - (blocks - 1) // 132) < 1e-6, row  # late: its last wave
    print("trace-chain: every chain time as built")


if __name__ == "__main__":
    main()
