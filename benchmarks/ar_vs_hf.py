"""paradec `ar` vs transformers `generate`: tokens/s on random-init Llama stand-ins.

Same checkpoint, same dtype, same prompts (HumanEval, truncated to one length so a batch needs
no padding), same number of new tokens (EOS ignored). Warm-up excluded; the two methods
alternate within each repeat; the median of the repeats is reported. Writes JSON + a table.

    python benchmarks/ar_vs_hf.py --out benchmarks/results/ar_vs_hf.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import paradec
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table, write_json
from paradec.bench.standins import standin


def time_it(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20M,60M")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--cache-dir", default="runs/standins")
    ap.add_argument("--out", default="benchmarks/results/ar_vs_hf.json")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    prompts = load_prompts(Path(args.data) / "humaneval/HumanEval.jsonl.gz", limit=8)
    n_new = args.max_new_tokens
    results = []
    for size in args.sizes.split(","):
        path = standin(args.cache_dir, size)
        for dtype in args.dtypes.split(","):
            engine = paradec.load(path, dtype=dtype)
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=paradec.engine.DTYPES[dtype]).eval()
            ids = [engine.tokenizer.encode(p.text)[: args.prompt_len] for p in prompts]
            ids = [x for x in ids if len(x) == args.prompt_len]
            for batch in (int(b) for b in args.batches.split(",")):
                x = ids[:batch]
                tensor = torch.tensor(x)

                def run_paradec(n=n_new, engine=engine, x=x):
                    return [g.token_ids for g in engine.generate(x, max_new_tokens=n, ignore_eos=True)]

                def run_hf(n=n_new, hf=hf, tensor=tensor):
                    with torch.inference_mode():
                        out = hf.generate(
                            tensor,
                            attention_mask=torch.ones_like(tensor),
                            do_sample=False,
                            max_new_tokens=n,
                            min_new_tokens=n,
                            pad_token_id=0,
                        )
                    return out[:, tensor.shape[1] :].tolist()

                run_paradec(8), run_hf(8)  # warm-up
                times = {"paradec": [], "hf": []}
                for r in range(args.repeats):
                    order = [("paradec", run_paradec), ("hf", run_hf)]
                    for name, fn in order if r % 2 == 0 else order[::-1]:
                        times[name].append(time_it(fn))
                same = run_paradec() == run_hf()
                rec = {
                    "size": size,
                    "dtype": dtype,
                    "batch": batch,
                    "new_tokens": n_new,
                    "paradec_tok_s": batch * n_new / statistics.median(times["paradec"]),
                    "hf_tok_s": batch * n_new / statistics.median(times["hf"]),
                    "times_s": times,
                    "identical_tokens": same,
                }
                rec["speedup"] = rec["paradec_tok_s"] / rec["hf_tok_s"]
                results.append(rec)
                print(
                    f"{size} {dtype} b{batch}: paradec {rec['paradec_tok_s']:.1f} tok/s, "
                    f"hf {rec['hf_tok_s']:.1f} tok/s, x{rec['speedup']:.2f}, identical={same}",
                    flush=True,
                )
    table = markdown_table(
        results, ["size", "dtype", "batch", "paradec_tok_s", "hf_tok_s", "speedup", "identical_tokens"]
    )
    print(table)
    write_json({"command": " ".join(sys.argv), "machine": machine(), "results": results, "table": table}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
