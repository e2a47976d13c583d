#!/usr/bin/env python3
"""table.py — turns bench/run.sh's raw lines into its table (standard library only).

    table.py RAW        RAW: lines `WHO MODEL {json}`, WHO one of
        kiln       the program built from the model file: --bench-steps line, or {"build_s": ..}
        kiln-b256  the same model built with batch bound 256: its inference at batch 256
        pytorch    bench/torch_bench.py's line
        sgemm      bench/sgemm's line for the Kiln step's GEMM shapes
Ratios are Kiln / PyTorch: below 1 Kiln is faster (or smaller). A WHO with several lines
for a model (bench/run.sh's BENCH_ROUNDS) gives each number as the median of its lines."""
import json, statistics, sys


def load(path):
    """Per model and WHO, the fields of its lines; a number measured in several rounds
    (BENCH_ROUNDS) is the median of the rounds, and `rounds` says how many there were."""
    runs = {}
    for line in open(path):
        parts = line.split(" ", 2)
        if len(parts) < 3 or not parts[2].startswith("{"):
            continue
        who, model, data = parts[0], parts[1], json.loads(parts[2])
        fields = runs.setdefault(model, {}).setdefault(who, {})
        for key, value in data.items():
            fields.setdefault(key, []).append(value)
    for model in runs.values():
        for who, fields in model.items():
            merged = {}
            for key, values in fields.items():
                numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
                merged[key] = statistics.median(values) if numbers else values[0]
            merged["rounds"] = max(len(v) for v in fields.values())
            model[who] = merged
    return runs


def num(v, digits=3):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.{digits}g}"


def main():
    runs = load(sys.argv[1])
    rows = [("model", "measure", "Kiln", "PyTorch", "Kiln/PyTorch")]
    notes = []
    for model, r in runs.items():
        k, kb, t, s = r.get("kiln", {}), r.get("kiln-b256", {}), r.get("pytorch", {}), r.get("sgemm", {})
        sizes = " x ".join(f"{n}={v}" for n, v in k.get("sizes", t.get("sizes", {})).items())

        def row(measure, kv, tv, digits=3):
            ratio = f"{kv / tv:.2f}" if kv is not None and tv else "-"
            rows.append((model, measure, num(kv, digits), num(tv, digits), ratio))

        rounds = f", median of {k['rounds']} runs" if k.get("rounds", 1) > 1 else ""
        row(f"train step, ms (median of {k.get('train_steps', '?')}{rounds}; {sizes})", k.get("train_step_ms_median"),
            t.get("train_step_ms_median"))
        row("inference batch 1, ms", k.get("infer_b1_ms"), t.get("infer_b1_ms"))
        big = kb if kb else k
        nb = big.get("infer_b256_batch")
        if nb is not None and t.get("infer_b256_batch") not in (None, nb):
            notes.append(f"{model}: Kiln's large inference batch is {nb}, PyTorch's {t.get('infer_b256_batch')}")
        row(f"inference batch {nb}, ms", big.get("infer_b256_ms"), t.get("infer_b256_ms"))
        row("RSS after training, MiB", k.get("train_rss_mb"), t.get("train_rss_mb"))
        row(f"peak RSS incl. batch-{nb} inference, MiB", big.get("peak_rss_mb"), t.get("peak_rss_mb"))
        rows.append((model, "kiln build, s", num(k.get("build_s")), "", ""))
        flops = k.get("gemm_flops_per_step")
        if flops and s.get("gflops"):
            rate = s["gflops"]

            def frac(ms):
                if not ms:
                    return "-"
                g = flops / ms / 1e6
                return f"{g:.1f} ({100 * g / rate:.0f}%)"

            rows.append((model, f"sgemm on the step's {len(s.get('shapes', []))} GEMM shapes, GFLOP/s", f"{rate:.1f}", "", ""))
            rows.append((model, f"step GEMM GFLOP/s ({flops / 1e9:.3g} GFLOP/step) (% of sgemm)",
                         frac(k.get("train_step_ms_median")), frac(t.get("train_step_ms_median")), ""))
            if s.get("square1024_gflops"):
                notes.append(f"{model}: sgemm 1024^3 {s['square1024_gflops']:.1f} GFLOP/s; the step's shapes take "
                             f"{s.get('ms', 0):.1f} ms of sgemm per step at {rate:.1f} GFLOP/s")
        if k.get("bounds") and k.get("sizes") and k["bounds"] != k["sizes"]:
            notes.append(f"{model}: the GEMM shapes are at the bounds {k['bounds']}, the step ran at {k['sizes']}")
    widths = [max(len(str(r[i])) for r in rows) for i in range(5)]
    out = []
    for i, r in enumerate(rows):
        out.append("  ".join(str(c).ljust(widths[j]) if j < 2 else str(c).rjust(widths[j]) for j, c in enumerate(r)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    print("\n".join(out))
    for n in notes:
        print("note: " + n)


if __name__ == "__main__":
    main()
