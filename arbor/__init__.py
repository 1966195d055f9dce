"""arbor.

Offline and quiet by default: no usage telemetry, so an offline node logs no telemetry errors. Set
when arbor is first imported, before Prefect or huggingface_hub read them, whether arbor runs from its CLI, a
benchmark, a notebook or a Prefect worker that imports its flows; a value the user exported wins.

DeepSpeed's CPU accelerator compiles its shm comm op on first use into torch's extension cache, one folder per
Python and accelerator shared by every environment of the user. Two environments (two checkouts) write different
include paths into its build file, so each use after the other's recompiles it (85-190 s on two cores). Each torch installation gets a folder of its own unless TORCH_EXTENSIONS_DIR is set (an environment
that reaches another's torch through a .pth line shares that one's build).
"""

import hashlib as _hashlib
import importlib.util as _importlib_util
import os as _os
import sys as _sys
from collections.abc import Mapping as _Mapping


def torch_extensions_dir(torch_dir: str, environ: _Mapping[str, str]) -> str:
    """The extension cache of the torch installed at ``torch_dir``: under the user's cache (XDG_CACHE_HOME or
    ~/.cache), ``torch_extensions/arbor-py3XY-<hash of torch_dir>``."""
    cache = environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    tag = _hashlib.sha256(_os.path.realpath(torch_dir).encode()).hexdigest()[:10]
    return _os.path.join(cache, "torch_extensions", f"arbor-py{_sys.version_info[0]}{_sys.version_info[1]}-{tag}")


def _torch_dir() -> str:
    """Where torch would be imported from (found, not imported: importing arbor stays cheap); else the environment."""
    spec = _importlib_util.find_spec("torch")
    return _os.path.dirname(spec.origin) if spec is not None and spec.origin else _sys.prefix


for _key, _value in (("DO_NOT_TRACK", "1"), ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
                     ("HF_HUB_DISABLE_TELEMETRY", "1")):
    _os.environ.setdefault(_key, _value)
if "TORCH_EXTENSIONS_DIR" not in _os.environ:
    _os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir(_torch_dir(), _os.environ)
