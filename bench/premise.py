"""Does ARBOR help where its premise holds? The registered table (docs/decisions/premise-two-hop-registration.md).

    python bench/premise.py --home H --seeds 0 2 4                  # every row, seed-major, one run after another
    python bench/premise.py --home H --rows arbor-world-step --seeds 0 1
    python bench/premise.py --table H1 H2 ...                        # the table over every finished run in the homes

The setting is tiny-world's default two-hop mix (``world:train`` / ``world:eval``), its profile temperature, 30
steps, K 8, 16 prompts a step, from one SFT start (bench/learning.py's, seed 0), with no in-run evaluation: the
primary metric is the final exam (the start and each run's last checkpoint answer all 200 held-out questions 4
times with the same sampling seeds). A row is a method and the keys that make it; a (row, seed) is one ordinary
``arbor-train`` run made by bench/learning.py's ``run_one`` and examined by its ``final_exam``, so an interrupted
lane resumes where it stopped and a finished run is reused. Several homes may run side by side (one process each);
each copies the start from ``--start`` so that every row trains from the same weights.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import learning  # noqa: E402  (bench/learning.py: run_one, start_for, final_exam, settings_tag)

# the registered setting: bench/learning.py's 30 steps and 4 exam samplings, no in-run evaluation
SETS: dict[str, Any] = {"run.steps": 30, "run.eval_every": None, "run.eval_runs": 4}
# row -> (method, the keys that make the row)
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "arbor-world": ("arbor", {"judge.backend": "world"}),
    "arbor-random": ("arbor", {"judge.backend": "random"}),
    "arbor-rules": ("arbor", {"judge.backend": "rules"}),
    "arbor-world-step": ("arbor", {"judge.backend": "world", "memory.count_activations": "step",
                                   "memory.shaping_filter": "batch"}),
    # the second registration: delta_v on the sparse graph's score lattice (one better trajectory of eight passes)
    "arbor-world-lattice": ("arbor", {"judge.backend": "world", "memory.delta_v": 0.03}),
    "arbor-random-lattice": ("arbor", {"judge.backend": "random", "memory.delta_v": 0.03}),
    # the third registration: the shaping coefficient lambda (eq. 4) at delta_v 0.03, the paper's Fig. 4a grid
    "arbor-world-lattice-lam0.2": ("arbor", {"judge.backend": "world", "memory.delta_v": 0.03, "memory.lambda_": 0.2}),
    "arbor-world-lattice-lam0.5": ("arbor", {"judge.backend": "world", "memory.delta_v": 0.03, "memory.lambda_": 0.5}),
}
FIRST = ["grpo", "arbor-world", "arbor-random", "arbor-rules"]  # the first registration's default lanes


def row_sets(row: str) -> dict[str, Any]:
    return {**SETS, **ROWS[row][1]}


def place_start(home: Path, start: Path | None) -> Path:
    """The SFT start in ``home``: a copy of ``start`` (content-addressed by its directory name), or trained here."""
    if start is None:
        return learning.start_for("grpo", SETS, home)
    dest = home / "sft" / start.name
    if not (dest / "arbor_sft.json").exists():
        tmp = dest.with_name(dest.name + f".copy-{os.getpid()}")
        shutil.copytree(start, tmp)
        tmp.rename(dest)
    return dest


def run_lane(home: Path, rows: list[str], seeds: list[int], start: Path | None) -> None:
    os.environ["ARBOR_HOME"] = str(home)
    home.mkdir(parents=True, exist_ok=True)
    sft = place_start(home, start)
    print(f"start {sft}", flush=True)
    start_exam = learning.final_exam(sft, f"exam-{sft.name}-premise", SETS, home)
    print(f"start exam {start_exam}", flush=True)
    from arbor.tasks.training.checkpoint import latest_complete

    for seed in seeds:
        for row in rows:
            method, _ = ROWS[row]
            t0 = time.perf_counter()
            rid, wall = learning.run_one(method, seed, sft, row_sets(row), home)
            ckpt = latest_complete(home / "checkpoints" / rid)
            assert ckpt is not None, f"{rid}: no complete checkpoint"
            learning.final_exam(ckpt / "hf", f"exam-{rid}", row_sets(row), home, method)
            print(f"{row} seed {seed}: {rid} (train {wall:.0f} s, with exam {time.perf_counter() - t0:.0f} s)",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, help="this lane's workspace")
    ap.add_argument("--rows", nargs="+", default=FIRST, choices=list(ROWS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--start", type=Path, default=None, help="an SFT start to copy (default: train one here)")
    ap.add_argument("--table", nargs="+", type=Path, default=None, help="print the table over these homes")
    ap.add_argument("--plot", type=Path, default=None, help="with --table: draw each row's exam F1 to this PNG")
    args = ap.parse_args(argv)
    if args.table:
        from premise_table import print_table

        print_table([h.resolve() for h in args.table], args.plot)
        return 0
    if args.home is None:
        raise SystemExit("--home is required to run a lane")
    run_lane(args.home.resolve(), args.rows, args.seeds, args.start.resolve() if args.start else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
