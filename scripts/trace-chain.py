#!/usr/bin/env python3
"""Times the chain of kernels of one-token steps from a KVS_TRACE file.

A timing build (cmake --preset trace-sm90) records, for every block of every kernel, when its
thread 0 reached pdl_wait() ("arrive") and when the wait returned ("go": the kernel before had
finished and its writes were visible), at the GPU's %globaltimer, inside recorded graphs and
with programmatic dependent launch on. The earliest "go" of a launch is thus when the launch
before it finished, and a kernel's share of the chain is the time from its predecessor's end
to its own: the sum of these over a step is the step.

    KVS_TRACE=t.bin build/trace/kvstream bench -m synthetic:llama3-8b:q4_0 ... -p 0 --n-gen 32
    scripts/trace-chain.py t.bin [launches.csv]

Prints, for each kernel of a layer (by its place in the layer; kernels are named by their grid
and block sizes, as the trace cannot name them): the mean time from the kernel before's end to
its own ("chain"), how long its first block waited for the kernel before ("early": its weights
load meanwhile), and how long after that its last block started ("late": blocks of later
waves); then the step's parts outside the layers and the step's mean time. The step's last
launch (the output product) is timed to the next step's first kernel, so its chain also holds
the gap between the two steps (the host's turn: the logits' copy, the next step's launch).
LAUNCHES.csv, if given, receives every launch's figures (the same order).
"""
import sys

import numpy as np

REC = np.dtype([("grid", "<u8"), ("arrive", "<u8"), ("go", "<u8"), ("block", "<u4"),
                ("sm", "<u4"), ("blocks", "<u4"), ("threads", "<u4")])


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"KVSTRACE":
        sys.exit(f"{path}: not a KVS_TRACE file")
    n, cap = (int(v) for v in np.frombuffer(data[8:24], "<u8"))
    rec = np.frombuffer(data[24:], REC)
    if len(rec) != cap:
        sys.exit(f"{path}: {len(rec)} records, the header says {cap}")
    if n <= cap:
        return rec[:n]
    at = n % cap  # the oldest record
    return np.concatenate([rec[at:], rec[:at]])


def launches(rec):
    """One row per launch, in the order they finished waiting: blocks, threads, recorded
    blocks, first arrive, first go, last go. A graph's node keeps its %gridid from replay to
    replay, so a node's records split into launches where their go times jump by a gap no
    launch's blocks spread over (the steps of a recorded graph are further apart)."""
    gap = 200_000  # ns
    rec = rec[np.lexsort((rec["go"], rec["grid"]))]
    go = rec["go"].astype(np.int64)
    new = np.concatenate([[True], (np.diff(rec["grid"]) != 0) | (np.diff(go) > gap)])
    cut = np.concatenate([np.flatnonzero(new), [len(rec)]])
    out = []
    for a, b in zip(cut[:-1], cut[1:]):
        r = rec[a:b]
        out.append((int(r["blocks"][0]), int(r["threads"][0]), len(r), int(r["arrive"].min()),
                    int(r["go"].min()), int(r["go"].max())))
    out.sort(key=lambda l: l[4])
    # The oldest launches may have lost blocks to the ring.
    while out and out[0][2] < out[0][0]:
        out.pop(0)
    return out


def period(sig):
    """The shortest p such that the middle of sig repeats every p (a layer's kernels)."""
    n = len(sig)
    for p in range(2, n // 3):
        a, b = n // 4, n - n // 4 - p
        if all(sig[i] == sig[i + p] for i in range(a, b)):
            return p
    return n


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: trace-chain.py TRACE [LAUNCHES.csv]")
    ls = launches(load(sys.argv[1]))
    if len(sys.argv) == 3:  # every launch, for other readings
        with open(sys.argv[2], "w") as f:
            f.write("blocks,threads,recorded,first_arrive_ns,first_go_ns,last_go_ns\n")
            f.writelines(",".join(map(str, l)) + "\n" for l in ls)
    sig = [(l[0], l[1]) for l in ls]
    # A step ends with the output product: the largest grid that comes back every step.
    counts = {s: sig.count(s) for s in set(sig)}
    out = max((s for s, c in counts.items() if c >= 3), key=lambda s: s[0])
    ends = [i for i, s in enumerate(sig) if s == out]
    steps = list(zip(ends[:-1], ends[1:]))
    if len(steps) < 2:
        sys.exit("fewer than 2 whole steps in the trace")
    # chain[i]: from the end of launch i - 1 to the end of launch i (the next one's first go).
    go = [l[4] for l in ls]
    step_ns = [go[b + 1] - go[a + 1] for a, b in steps if b + 1 < len(ls)]
    steps = steps[: len(step_ns)]
    n_step = len(steps)
    seq = sig[steps[0][0] + 1 : steps[0][1] + 1]
    if any(sig[a + 1 : b + 1] != seq for a, b in steps):
        sys.exit("the steps' kernels differ")
    p = period(seq)
    first = next(i for i in range(len(seq)) if seq[i : i + p] == seq[i + p : i + 2 * p])
    n_layers = 1
    while seq[first : first + p] == seq[first + n_layers * p : first + (n_layers + 1) * p]:
        n_layers += 1
    per = np.zeros((len(seq), 3))
    for a, _ in steps:
        for i in range(len(seq)):
            k = a + 1 + i
            per[i] += (go[k + 1] - go[k], go[k] - ls[k][3], ls[k][5] - ls[k][4])
    per /= n_step * 1e3  # us
    missing = sum(ls[a + 1 + i][0] - ls[a + 1 + i][2] for a, _ in steps for i in range(len(seq)))
    mean = np.mean(step_ns) / 1e3
    print(f"{n_step} steps of {len(seq)} launches: {mean:.1f} us a step ({1e6 / mean:.1f} tok/s), "
          f"{n_layers} layers of {p} kernels from launch {first}"
          + (f"; {missing} blocks did not record" if missing else ""))
    print("| place | blocks x threads | chain us | early us | late us | share of the step |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    layer = per[first : first + n_layers * p].reshape(n_layers, p, 3).mean(axis=0)
    for j in range(p):
        b, t = seq[first + j]
        print(f"| layer {j} | {b} x {t} | {layer[j][0]:.2f} | {layer[j][1]:.2f} | "
              f"{layer[j][2]:.2f} | {100 * layer[j][0] * n_layers / mean:.1f} % |")
    print(f"| a layer | | {layer[:, 0].sum():.2f} | | | "
          f"{100 * layer[:, 0].sum() * n_layers / mean:.1f} % |")
    for i in list(range(first)) + list(range(first + n_layers * p, len(seq))):
        b, t = seq[i]
        print(f"| step {i} | {b} x {t} | {per[i][0]:.2f} | {per[i][1]:.2f} | {per[i][2]:.2f} | "
              f"{100 * per[i][0] / mean:.1f} % |")
    print("(the last launch's chain runs to the next step's first kernel: it holds the gap "
          "between steps)")


if __name__ == "__main__":
    main()
