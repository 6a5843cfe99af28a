"""What one of `auto`'s drafters gains it: registers `auto-DRAFTER` (`auto` with that drafter not
offered) and runs `paradec bench` or `serve_lockstep.py` with it beside the others, interleaved.

    python benchmarks/auto_without.py rest bench --methods ar,pld,auto,auto-rest \\
        --prompts ../shared/data/spec_bench/question.jsonl --per-category 3 --first-turn \\
        --max-new-tokens 128 --repeats 3 --out benchmarks/results/auto_rest_amx_specbench39_rep3
    python benchmarks/auto_without.py rest lockstep --clients 4 --passes 2 --methods ar,auto,auto-rest,pld \\
        --out benchmarks/results/serve_lockstep_rest_c4

DRAFTER: rest (the datastore), pld (prompt lookup), or a model drafter (eagle, medusa, specinfer).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from paradec import factories, methods


def without(name: str):
    def drafter(target, gen):
        auto = factories.auto(target, gen)
        auto.lookups.pop(name, None)  # rest, pld
        auto.arms.pop(name, None)
        return auto

    return drafter


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] not in ("bench", "lockstep"):
        sys.exit(__doc__)
    name, runner, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    methods.register(replace(methods.get("auto"), name=f"auto-{name}", drafter=without(name), demo=None))
    if runner == "bench":
        from paradec.cli import main as cli

        sys.exit(cli(["bench", *rest]))
    sys.path.insert(0, str(Path(__file__).parent))
    import serve_lockstep

    sys.argv = [sys.argv[0], *rest]
    serve_lockstep.main()


if __name__ == "__main__":
    main()
