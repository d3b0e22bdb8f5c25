"""The large pixelfly MLP against nn.Linear in bf16, round by round: where a 100-step benchmark
spends more than one profiled step.

    python bench/pixelfly_rounds.py LABEL --out DIR     # on a GPU, about 30 s

``bench/pixelfly.py``'s large MLP (2048 -> 8192 -> 4096, block 256, butterfly 64, input
[16, 512, 2048] that needs its gradient), ``impl="kernels"``, and its ``nn.Linear`` twin: 5 warm-up
steps each, then 6 rounds alternating the two, 100 steps ``mlp(x).sum().backward()`` a round,
with a CUDA event after every step (``steps``: the mean of each 10 steps, µs) and the round's wall
time (``rounds``, s); ``ratios`` are the rounds' sparse / dense times.  After them, the host time
of a sparse step while the GPU is kept busy (``host_us``).  ``nvidia-smi`` samples SM clock, power
and throttle reasons every 200 ms into ``smi-LABEL.csv`` beside ``pixelfly-rounds-LABEL.json``.
``results/raw/pixelfly-rounds-h200.json`` holds five such runs (``bias-stream-*``: with and without
an experiment since removed, see ``bench/README.md``).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from blocksparse.torch import PixelflyLinear  # noqa: E402

LAYERS = [(2048, 8192), (8192, 4096)]


def mlp(kind):
    if kind == "dense":
        mods = [torch.nn.Linear(i, o) for i, o in LAYERS]
    else:
        mods = [PixelflyLinear(i, o, 256, 64, impl="kernels") for i, o in LAYERS]
    return torch.nn.Sequential(*mods).cuda().bfloat16()


def rounds(models, x, count=6, steps=100):
    """``(round seconds, per-10-step µs)`` by model name, the models alternating round by round."""
    seconds, means = {k: [] for k in models}, {k: [] for k in models}
    for _ in range(count):
        for name, m in models.items():
            events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
            torch.cuda.synchronize()
            start = time.perf_counter()
            events[0].record()
            for i in range(steps):
                m(x).sum().backward()
                events[i + 1].record()
            torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - start)
            step = [events[i].elapsed_time(events[i + 1]) * 1000 for i in range(steps)]
            means[name].append([round(sum(step[j:j + 10]) / 10, 1) for j in range(0, steps, 10)])
            print(name, round(seconds[name][-1] * 1e4, 1), "µs a step; 10-step means", means[name][-1], flush=True)
    return seconds, means


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("label")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    query = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    with open(os.path.join(args.out, f"smi-{args.label}.csv"), "w") as log:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", "-lms", "200"],
                               stdout=log)
        try:
            x = torch.randn(16, 512, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            models = {k: mlp(k) for k in ("dense", "sparse")}
            for m in models.values():
                for _ in range(5):
                    m(x).sum().backward()
            seconds, means = rounds(models, x)
            torch.cuda.synchronize()
            torch.cuda._sleep(int(2e9))  # the GPU busy for about a second: the loop below times the host
            start = time.perf_counter()
            for _ in range(20):
                models["sparse"](x).sum().backward()
            host = (time.perf_counter() - start) / 20 * 1e6
            torch.cuda.synchronize()
        finally:
            smi.terminate()
    ratios = [a / b for a, b in zip(seconds["sparse"], seconds["dense"])]
    print(args.label, "median ratio", sorted(ratios)[len(ratios) // 2], "host µs a sparse step", round(host, 1))
    with open(os.path.join(args.out, f"pixelfly-rounds-{args.label}.json"), "w") as f:
        json.dump({"rounds": seconds, "steps": means, "ratios": ratios, "host_us": host}, f)


if __name__ == "__main__":
    main()
