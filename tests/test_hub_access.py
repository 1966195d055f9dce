"""Hub access for users: arbor never forces the Hub offline; preflight refuses an uncached Hub id
only when the environment keeps the Hub offline (saying how to fix it); question sets ``hf:<owner>/<name>/<file>``
and ``hf:<owner>/<name>[/<folder>]:<split>`` are read from a Hugging Face cache built here, or downloaded through
huggingface_hub when online (faked: no network in tests)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import constants

from arbor.config import load_config
from arbor.config.inputs import is_named_set
from arbor.paths import PROJECT_ROOT
from arbor.preflight import check
from arbor.tasks.env import embed
from arbor.tasks.env.datasets import DatasetError, fields_of, load_questions
from arbor.tasks.env.hub import offline_variable

SHA, SHA_V1 = "a" * 40, "b" * 40
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face Hub cache for this test (huggingface_hub reads its location at import)."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _offline(monkeypatch: pytest.MonkeyPatch, var: str = "HF_HUB_OFFLINE") -> None:
    for v in OFFLINE_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", var == "HF_HUB_OFFLINE")


def _online(monkeypatch: pytest.MonkeyPatch) -> None:
    for v in OFFLINE_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def _put(cache: Path, kind: str, repo: str, files: dict[str, object], sha: str = SHA, ref: str = "main") -> Path:
    """Files into the cache's layout: ``<kind>s--owner--name/refs/<ref>`` -> sha, ``snapshots/<sha>/<path>``.
    A list value is written as Parquet rows, anything else as text."""
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(sha)
    for rel, content in files.items():
        path = root / "snapshots" / sha / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, list):
            pq.write_table(pa.Table.from_pylist(content), path)
        else:
            path.write_text(str(content))
    return root / "snapshots" / sha


def _rows(prefix: str, n: int, start: int = 0) -> list[dict]:
    return [{"id": f"{prefix}{i}", "question": f"{prefix} question {i}?", "golden_answers": [f"{prefix}{i}"]}
            for i in range(start, start + n)]


# ----------------------------------------------------------------------------------------------- no forced offline


_LIBRARY = ("arbor", "tasks", "llm", "storage", "flows")


def _sets_offline(tree: ast.AST) -> list[int]:
    """Lines that write an offline variable into the environment (os.environ[...] = / setdefault / update / putenv)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value in OFFLINE_VARS
                                              for a in [*node.args, *(k.value for k in node.keywords)]):
            func = ast.unparse(node.func)
            if func.endswith(("environ.setdefault", "putenv", "environ.update")):
                lines.append(node.lineno)
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Subscript) and ast.unparse(target.slice).strip("'\"") in OFFLINE_VARS:
                    lines.append(node.lineno)
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in OFFLINE_VARS
                                              for k in node.keys):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scanner_sees_the_old_forced_offline() -> None:
    old = 'import os\nos.environ.setdefault("HF_HUB_OFFLINE", "1")\nos.environ["TRANSFORMERS_OFFLINE"] = "1"\n'
    assert _sets_offline(ast.parse(old)) == [2, 3]


def test_library_code_never_sets_the_hub_offline() -> None:
    """Only the Makefile and the tests decide to be offline: no library module writes HF_HUB_OFFLINE."""
    found = [f"{p.relative_to(PROJECT_ROOT)}:{line}" for pkg in _LIBRARY for p in sorted((PROJECT_ROOT / pkg).rglob("*.py"))
             for line in _sets_offline(ast.parse(p.read_text(), str(p)))]
    assert found == []


def test_loading_the_embedder_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """tasks.env.embed used to set HF_HUB_OFFLINE=1 for the whole process when it loaded a model."""
    import sentence_transformers

    _online(monkeypatch)
    loaded = []
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", lambda path, device: loaded.append(path) or "m")
    embed.load_embedder.cache_clear()
    try:
        assert embed.load_embedder("someorg/some-embedder") == "m"
    finally:
        embed.load_embedder.cache_clear()
    assert loaded == ["someorg/some-embedder"]  # a Hub id goes to sentence-transformers as is (it downloads)
    assert not any(v in os.environ for v in OFFLINE_VARS)
    assert offline_variable() is None


def test_offline_variables_as_huggingface_hub_reads_them() -> None:
    assert offline_variable({}) is None
    assert offline_variable({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "no"}) is None
    assert offline_variable({"HF_HUB_OFFLINE": "yes"}) == "HF_HUB_OFFLINE"
    assert offline_variable({"TRANSFORMERS_OFFLINE": "1"}) == "TRANSFORMERS_OFFLINE"


# ----------------------------------------------------------------------------------------------- models in preflight


def _problems(key: str, **over: str) -> list[str]:
    return [m for m in check(load_config("tiny-cpu", over), gpu_count=0, env={}) if m.startswith(key)]


def test_uncached_hub_model_is_refused_only_offline(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = {"policy.model": "someorg/some-model"}
    _offline(monkeypatch)
    [msg] = _problems("policy.model", **model)
    assert msg.startswith("policy.model: 'someorg/some-model': the Hub is offline here (HF_HUB_OFFLINE=1) and it is "
                          f"not in the Hugging Face cache {hub_cache}: download it first")
    assert "`hf download someorg/some-model`" in msg and "or unset HF_HUB_OFFLINE to let the run download it" in msg
    _offline(monkeypatch, "TRANSFORMERS_OFFLINE")
    [msg] = _problems("policy.model", **model)
    assert "(TRANSFORMERS_OFFLINE=1)" in msg and "unset TRANSFORMERS_OFFLINE" in msg
    _online(monkeypatch)
    assert _problems("policy.model", **model) == []  # the run downloads it
    # not a Hub id at all: refused whether online or not
    [msg] = _problems("policy.model", **{"policy.model": "/no/such/dir/Qwen3-8B"})
    assert "is neither a local path nor a Hugging Face Hub id" in msg
    # in the cache: fine offline
    _offline(monkeypatch)
    _put(hub_cache, "model", "someorg/some-model", {"config.json": "{}"})
    assert _problems("policy.model", **model) == []


def test_embedder_hub_id_follows_the_same_rule(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    over = {"run.method": "arbor", "memory.embedder": "someorg/embedder"}
    _offline(monkeypatch)
    [msg] = _problems("memory.embedder", **over)
    assert "memory.embedder: 'someorg/embedder': the Hub is offline here (HF_HUB_OFFLINE=1)" in msg
    assert "run.method=arbor embeds with it" in msg
    _online(monkeypatch)
    assert _problems("memory.embedder", **over) == []


# ----------------------------------------------------------------------------------------------- datasets on the Hub


def _qa_repo(cache: Path) -> None:
    verl = [{"prompt": [{"role": "user", "content": f"Q: {q}"}], "reward_model": {"ground_truth": {"target": [a]}},
             "extra_info": {"index": i, "question": q}} for i, (q, a) in enumerate([("q0?", "a0"), ("q1?", "a1")])]
    _put(cache, "dataset", "acme/qa", {
        "train.parquet": verl,
        "data/test-00000-of-00002.parquet": _rows("s0-", 2),
        "data/test-00001-of-00002.parquet": _rows("s1-", 3),
        "nq/dev.jsonl": "".join(json.dumps(r) + "\n" for r in _rows("nq", 2)),
        "hotpotqa/dev.jsonl": "".join(json.dumps(r) + "\n" for r in _rows("hq", 1)),
        "README.md": "# acme/qa\n",
    })
    _put(cache, "dataset", "acme/qa", {"train.parquet": _rows("v1-", 1)}, sha=SHA_V1, ref="v1")


def test_hub_question_sets_from_the_cache(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(monkeypatch)
    _qa_repo(hub_cache)
    cfg = load_config("tiny-cpu", {"data.train": "hf:acme/qa/train.parquet"})
    qs = load_questions(cfg.data.train, size=cfg.data.train_size, seed=cfg.run.seed, config=cfg,
                        fields=fields_of(cfg.data))  # as flows.run_setup loads data.train
    assert [(q.question_id, q.question, q.golds) for q in qs] == [("0", "q0?", ["a0"]), ("1", "q1?", ["a1"])]
    # a split: both shards, in shard order
    assert [q.question_id for q in load_questions("hf:acme/qa:test")] == ["s0-0", "s0-1", "s1-0", "s1-1", "s1-2"]
    # a revision (a tag's ref in the cache) reads that commit's file
    assert [q.question_id for q in load_questions("hf:acme/qa@v1/train.parquet")] == ["v1-0"]
    # a split in a folder per configuration: named folder, or refused naming the folders
    assert [q.question_id for q in load_questions("hf:acme/qa/nq:dev")] == ["nq0", "nq1"]
    with pytest.raises(DatasetError, match=r"split 'dev' is in several folders of dataset acme/qa \(hotpotqa, nq\); "
                                           r"name one, e.g. hf:acme/qa/nq:dev"):
        load_questions("hf:acme/qa:dev")
    with pytest.raises(DatasetError, match=r"'hf:acme/qa/README\.md': name a \.parquet or \.jsonl file"):
        load_questions("hf:acme/qa/README.md")
    with pytest.raises(DatasetError, match=r"'hf:acme': not a Hub dataset id"):
        load_questions("hf:acme")
    # the CLI keeps the spec as a named set (not a file relative to the current directory)
    assert is_named_set("hf:acme/qa/train.parquet") and is_named_set("hf:acme/qa/nq:dev")
    assert _problems("data.train", **{"data.train": "hf:acme/qa:test"}) == []


def test_uncached_hub_question_set_offline_names_key_and_fix(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(monkeypatch)
    _qa_repo(hub_cache)
    spec = "hf:acme/elsewhere/train.parquet"
    with pytest.raises(DatasetError) as e:
        load_questions(spec)
    assert str(e.value).startswith(f"question set '{spec}': the Hub is offline here (HF_HUB_OFFLINE=1) and it is not "
                                   f"in the Hugging Face cache {hub_cache}")
    assert "`hf download acme/elsewhere train.parquet --repo-type dataset`" in str(e.value)
    [msg] = _problems("data.train", **{"data.train": spec})
    assert msg.startswith(f"data.train: {spec}: the Hub is offline here (HF_HUB_OFFLINE=1)")
    assert "or unset HF_HUB_OFFLINE to let the run download it" in msg
    # a split the cached snapshot lacks is not in the cache either
    [msg] = _problems("data.eval", **{"data.eval": "hf:acme/qa:validation", "run.eval_every": "1"})
    assert msg.startswith("data.eval: hf:acme/qa:validation: the Hub is offline here")
    # a cached file with a malformed row: key, spec, file and row
    _put(hub_cache, "dataset", "acme/bad", {"train.parquet": [{"question": "ok?", "answer": "x"},
                                                              {"question": "no answer?", "answer": ""}]})
    [msg] = _problems("data.train", **{"data.train": "hf:acme/bad/train.parquet"})
    assert msg.startswith("data.train: hf:acme/bad/train.parquet: ") and "train.parquet: row 2: field 'answer'" in msg
    # online, an uncached set is left to the run (nothing is fetched by preflight)
    _online(monkeypatch)
    assert _problems("data.train", **{"data.train": spec}) == []


def test_online_hub_question_set_is_downloaded(hub_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online, the split's files are listed on the Hub and downloaded through huggingface_hub (faked here)."""
    _online(monkeypatch)
    served = tmp_path / "served"
    served.mkdir()
    files = {"data/train-00000-of-00002.parquet": _rows("a", 2), "data/train-00001-of-00002.parquet": _rows("b", 1),
             "data/test-00000-of-00001.parquet": _rows("t", 1), "extra/train.jsonl": "x"}
    calls: list[tuple] = []

    def list_repo_files(self: object, repo_id: str, *, repo_type: str, revision: str | None) -> list[str]:
        calls.append(("list", repo_id, repo_type, revision))
        return list(files)

    def hf_hub_download(repo_id: str, filename: str, *, repo_type: str, revision: str | None) -> str:
        calls.append(("get", repo_id, filename, repo_type, revision))
        path = served / filename.replace("/", "_")
        pq.write_table(pa.Table.from_pylist(files[filename]), path)
        return str(path)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    qs = load_questions("hf:acme/fresh@v2:train")
    assert [q.question_id for q in qs] == ["a0", "a1", "b0"]  # parquet shards preferred over extra/train.jsonl
    assert calls == [("list", "acme/fresh", "dataset", "v2"),
                     ("get", "acme/fresh", "data/train-00000-of-00002.parquet", "dataset", "v2"),
                     ("get", "acme/fresh", "data/train-00001-of-00002.parquet", "dataset", "v2")]
    calls.clear()
    assert [q.question_id for q in load_questions("hf:acme/fresh/data/test-00000-of-00001.parquet")] == ["t0"]
    assert calls == [("get", "acme/fresh", "data/test-00000-of-00001.parquet", "dataset", None)]


def test_cli_refuses_an_uncached_hub_set_offline(tmp_path: Path) -> None:
    """The user's path: `arbor train data.train=hf:...` on an offline node without the file says what to do."""
    env = {"ARBOR_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "-p", "tiny-cpu",
                           "data.train=hf:acme/qa/train.parquet"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert ("data.train: hf:acme/qa/train.parquet: the Hub is offline here (HF_HUB_OFFLINE=1) and it is not in the "
            f"Hugging Face cache {tmp_path / 'empty-cache'}") in proc.stderr
    assert not (tmp_path / "home" / "runs").exists()
