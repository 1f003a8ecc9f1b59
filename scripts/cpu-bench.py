#!/usr/bin/env python3
"""The CPU backend against stock llama.cpp, alternating, on a shared or noisy machine.

Each round runs, per model, `llama-bench -t T -p 512 -n 64 -r 3 -d DEPTHS` and `kvstream bench
--backend cpu -t T --depths DEPTHS -p 512 --n-gen 64 -r 3` one after the other (which goes first
alternates between rounds, so a drift of the machine's load falls on both), and kvstream's run
also times verify steps of k tokens against its one-token step (--verify-tokens). The report is
the median of the rounds per model, depth and test, the ratio of the medians, and the median of
the rounds' own ratios; the JSON keeps every round's figures, the CPU's model name and flags, and
the instruction set kvstream's kernels were forced to (KVS_CPU_ISA).

  scripts/cpu-bench.py --isa avx2 --rounds 5 --models smollm2,qwen2-0.5b:q4_k,qwen2-0.5b:q8_0 \\
      --json bench/results/cpu-avx2-2core.json

Models: `smollm2` (models/SmolLM2-135M-Instruct.Q4_1.gguf, scripts/fetch-model.sh), or a
synthetic preset `NAME:TYPE`, written once by `kvstream synth` into --synth-dir (llama.cpp loads
the same file). llama-bench: tests/peers/build-llama.sh --bench builds it (AVX2, FMA, F16C; no
AVX-512, no VNNI) into ~/.cache/kvstream/peers, which this script runs where it is missing.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("KVS_PEERS_CACHE", Path.home() / ".cache/kvstream/peers"))


def cpu_info():
    """The model name and flags of /proc/cpuinfo's first processor, and the core count."""
    name, flags = platform.processor(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.processor()):
                name = value.strip()
            elif key.strip() == "flags":
                flags = value.split()
                break
    except OSError:
        pass
    return {"model": name, "flags": flags, "cpus": os.cpu_count()}


def model_path(spec, kvstream, synth_dir):
    if spec == "smollm2":
        p = ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
        if not p.exists():
            subprocess.run([str(ROOT / "scripts/fetch-model.sh"), "smollm2"], check=True, cwd=ROOT)
        return p
    p = Path(synth_dir) / (spec.replace(":", "-") + ".gguf")
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([kvstream, "synth", spec, "-o", str(p)], check=True)
    return p


def run_llama(bench, model, a):
    cmd = [bench, "-m", str(model), "-t", str(a.threads), "-p", "512", "-n", "64", "-r", "3",
           "-d", ",".join(str(d) for d in a.depths), "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res = {}
    for e in json.loads(out):
        test = "pp" if e["n_gen"] == 0 else "tg"
        res[(e.get("n_depth", 0), test)] = e["avg_ts"]
    return " ".join(cmd), res


def run_kvstream(kvstream, model, a, out_json):
    cmd = [kvstream, "bench", "-m", str(model), "--backend", "cpu", "-t", str(a.threads),
           "--depths", ",".join(str(d) for d in a.depths), "-p", "512", "--n-gen", "64", "-r",
           "3", "--json", out_json]
    if a.verify:
        cmd += ["--verify-tokens", a.verify]
    env = dict(os.environ)
    if a.isa:
        env["KVS_CPU_ISA"] = a.isa
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    j = json.loads(Path(out_json).read_text())
    res, verify = {}, {}
    for r in j["runs"]:
        res[(r["depth"], "tg")] = r["tg_tokens_per_s"]
        res[(r["depth"], "pp")] = r.get("pp_tokens_per_s", 0.0)
        for v in r.get("verify", []):
            verify[(r["depth"], v["tokens"])] = v["ratio_to_tg_step"]
    return " ".join(cmd), res, verify, j.get("cpu", {})


def med(xs):
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,qwen2-0.5b:q4_k,qwen2-0.5b:q8_0")
    ap.add_argument("--depths", default="0,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default="avx2",
                    help="KVS_CPU_ISA for kvstream (avx2, avx-vnni, avx512-vnni; '' = detected)")
    ap.add_argument("--verify", default="2,4,8", help="--verify-tokens of kvstream ('' = none)")
    ap.add_argument("--kvstream", default=str(ROOT / "build/cpu/kvstream"))
    ap.add_argument("--llama-bench", default=str(PEERS / "build-0.3.36/bin/llama-bench"))
    ap.add_argument("--synth-dir", default=str(Path.home() / ".cache/kvstream/synth"))
    ap.add_argument("--json", help="write every round and the medians here")
    a = ap.parse_args()
    a.depths = [int(d) for d in a.depths.split(",")]
    if not Path(a.llama_bench).exists():
        subprocess.run([str(ROOT / "tests/peers/build-llama.sh"), "--bench"], check=True,
                       stdout=subprocess.DEVNULL)
    if not Path(a.llama_bench).exists():
        sys.exit(f"cpu-bench: no {a.llama_bench} (tests/peers/build-llama.sh --bench builds it)")

    models = {m: model_path(m, a.kvstream, a.synth_dir) for m in a.models.split(",")}
    rounds, commands, kvs_cpu = [], {}, {}
    tmp = f"/tmp/cpu-bench-{os.getpid()}.json"
    for i in range(a.rounds):
        for name, path in models.items():
            t0 = time.time()
            rec = {"round": i, "model": name}
            order = ["llama", "kvstream"] if i % 2 == 0 else ["kvstream", "llama"]
            for who in order:
                if who == "llama":
                    commands["llama"], rec["llama"] = run_llama(a.llama_bench, path, a)
                else:
                    commands["kvstream"], rec["kvstream"], rec["verify"], kvs_cpu = run_kvstream(
                        a.kvstream, path, a, tmp)
            rec["load_avg"] = os.getloadavg()[0]
            rounds.append(rec)
            line = " ".join(
                f"{t}{d}: {rec['kvstream'][(d, t)]:.1f}/{rec['llama'][(d, t)]:.1f}"
                for d in a.depths for t in ("tg", "pp"))
            print(f"round {i} {name} ({time.time() - t0:.0f} s, load {rec['load_avg']:.2f}) "
                  f"kvstream/llama.cpp {line}", flush=True)
            report(a, models, rounds, commands, kvs_cpu, final=False)
    report(a, models, rounds, commands, kvs_cpu, final=True)


def report(a, models, rounds, commands, kvs_cpu, final):
    """The medians so far, printed at the end and written to --json after every round (a run
    cut short keeps its rounds)."""
    table = []
    for name in models:
        rs = [r for r in rounds if r["model"] == name]
        if not rs:  # a model the current round has not reached yet
            continue
        for d in a.depths:
            for t in ("tg", "pp"):
                k = med([r["kvstream"][(d, t)] for r in rs])
                ll = med([r["llama"][(d, t)] for r in rs])
                rr = med([r["kvstream"][(d, t)] / r["llama"][(d, t)] for r in rs])
                table.append({"model": name, "depth": d, "test": f"{t}{64 if t == 'tg' else 512}",
                              "kvstream": k, "llama_cpp": ll, "ratio": k / ll,
                              "median_round_ratio": rr})
        for (d, kk) in sorted({key for r in rs for key in r["verify"]}):
            table.append({"model": name, "depth": d, "test": f"verify{kk}",
                          "ratio_to_tg_step": med([r["verify"][(d, kk)] for r in rs])})

    done = max(r["round"] for r in rounds) + 1
    isa = kvs_cpu.get("isa", "?")
    if final:
        print_table(a, table, done, isa, kvs_cpu)
    if a.json:
        def keyed(d):
            return {f"{k[0]}:{k[1]}": v for k, v in d.items()}
        out = {
            "cpu": cpu_info(),
            "kvstream_cpu": kvs_cpu,
            "forced_isa": a.isa or None,
            "llama_cpp": {"build": "llama-cpp-python 0.3.36 vendored llama.cpp, GGML_NATIVE=OFF, "
                                   "AVX2 FMA F16C BMI2, no AVX-512, no AVX-VNNI",
                          "binary": a.llama_bench},
            "kvstream_binary": a.kvstream,
            "threads": a.threads,
            "rounds": done,
            "commands": commands,
            "models": {k: str(v) for k, v in models.items()},
            "medians": table,
            "per_round": [{**r, "llama": keyed(r["llama"]), "kvstream": keyed(r["kvstream"]),
                           "verify": keyed(r["verify"])} for r in rounds],
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
        if final:
            print(f"wrote {a.json}")


def print_table(a, table, done, isa, kvs_cpu):
    print(f"\nmedians of {done} alternating rounds, {a.threads} threads, kvstream {isa} "
          f"({kvs_cpu.get('isa_origin', '?')}), {cpu_info()['model']}")
    print("| model | depth | test | kvstream | llama.cpp | ratio | median of rounds' ratios |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for e in table:
        if "ratio" in e:
            print(f"| {e['model']} | {e['depth']} | {e['test']} | {e['kvstream']:.1f} | "
                  f"{e['llama_cpp']:.1f} | {e['ratio']:.2f} | {e['median_round_ratio']:.2f} |")
        else:
            print(f"| {e['model']} | {e['depth']} | {e['test']} | {e['ratio_to_tg_step']:.2f}x "
                  f"the one-token step | | | |")


if __name__ == "__main__":
    main()
