"""Secrets by kind: every URL-typed config field refuses a credential, every field that names an environment variable
refuses a key, and neither repeats the value; a string field whose name says URL or key must be one of the two kinds,
so a field added later is checked without a list to update."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from arbor.config import ArborConfig, ConfigError, load_config
from arbor.config.base import ENV_NAME, URL, Section, string_kind
from arbor.config.judge import JudgeConfig
from arbor.config.resume import amend_config

Path_ = tuple[str | int, ...]  # a field's place in the schema; an int is a list position (guidance.rank_judges.0)

CREDENTIALED = ["http://u:SECRET@h", "https://u:SECRET@h:8/v1", "http://h:1/v1?api_key=SECRET",
                "http://h/search?x=1&access_token=SECRET", "https://h/v1#token=SECRET"]
KEYS = ["sk-SECRET0123456789abcdef", "hf_SECRETabcdefGHIJKL0123456789", "sk_live_SECRET0123456789",
        "ghp_SECRETabcdef0123456789ABCDEF", "SECRET key with spaces", "a9F3kQ7zSECRETx2Lm8"]
# a string field named like this holds a URL or a key's variable: it must be typed Url or EnvName
URL_NAME = re.compile(r"url|uri|endpoint", re.IGNORECASE)
KEY_NAME = re.compile(r"(^|_)(key|token|secret|password)(_|$)|_env$", re.IGNORECASE)


def _holds_str(ann: Any) -> bool:
    return ann is str or any(_holds_str(a) for a in get_args(ann))


def string_fields(model: type[BaseModel] = ArborConfig, path: Path_ = ()) -> list[tuple[Path_, FieldInfo]]:
    """(path, field) of every string-valued field of the schema: sections and list items (guidance.rank_judges)
    walked through ``model_fields``."""
    out: list[tuple[Path_, FieldInfo]] = []
    for name, f in model.model_fields.items():
        subs = [a for a in (f.annotation, *get_args(f.annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if subs:
            out += string_fields(subs[0], (*path, name, 0) if get_origin(f.annotation) is list else (*path, name))
        elif _holds_str(f.annotation):
            out.append(((*path, name), f))
    return out


def dotted(path: Path_) -> str:
    return ".".join(map(str, path))


def override(path: Path_, value: Any) -> tuple[str, Any]:
    """``--set``'s (key, value) that puts ``value`` at ``path``; below a list position, the default list with that
    item's field replaced (guidance.rank_judges: the paper's council, its first judge changed)."""
    cut = next((i for i, p in enumerate(path) if isinstance(p, int)), len(path))
    if cut == len(path):
        return dotted(path), value
    whole: Any = ArborConfig().model_dump(mode="json")
    for p in path[:cut]:
        whole = whole[p]
    node = whole
    for p in path[cut:-1]:
        node = node[p]
    node[path[-1]] = value
    return dotted(path[:cut]), whole


def unchecked(fields: list[tuple[Path_, FieldInfo]]) -> list[str]:
    """Fields named like a URL or a key that are not typed as the matching kind."""
    bad = []
    for path, f in fields:
        name, kind = str(path[-1]), string_kind(f)
        if URL_NAME.search(name) and kind is not URL or KEY_NAME.search(name) and kind is not ENV_NAME:
            bad.append(dotted(path))
    return bad


FIELDS = string_fields()
URL_FIELDS = [p for p, f in FIELDS if string_kind(f) is URL]
ENV_FIELDS = [p for p, f in FIELDS if string_kind(f) is ENV_NAME]


def test_the_walk_finds_every_kind_in_every_section() -> None:
    urls, envs = {dotted(p) for p in URL_FIELDS}, {dotted(p) for p in ENV_FIELDS}
    assert {"judge.base_url", "judge.roles.pairwise.base_url", "rollout.base_url", "search.url",
            "tracking.mlflow_tracking_uri", "guidance.rank_judges.0.base_url"} <= urls
    assert {"judge.api_key_env", "judge.roles.step_rubric.api_key_env", "rollout.api_key_env", "search.api_key_env",
            "guidance.rank_judges.0.api_key_env"} <= envs
    # the judge, its 13 roles, the council's judge, rollout, search; and the URL of tracking
    assert (len(urls), len(envs)) == (18, 17)


def test_every_string_field_named_like_a_url_or_key_is_typed_as_one() -> None:
    assert unchecked(FIELDS) == [], "type the field Url or EnvName (arbor.config.base)"


def test_a_url_field_added_later_untyped_is_caught() -> None:
    class Later(Section):
        webhook_url: str | None = None
        hub_endpoint: str = "x"
        token_env: str | None = None
        plain: str = "x"

    assert unchecked(string_fields(Later)) == ["webhook_url", "hub_endpoint", "token_env"]


@pytest.mark.parametrize("path", URL_FIELDS, ids=dotted)
def test_url_fields_refuse_credentials_without_echoing_them(path: Path_) -> None:
    for bad in CREDENTIALED:
        with pytest.raises(ConfigError) as err:
            load_config("tiny-cpu", [override(path, bad)])
        msg = str(err.value)
        assert dotted(path) in msg and "carries a credential" in msg and "SECRET" not in msg, msg
        assert "\n" not in msg
    key, value = override(path, "http://127.0.0.1:9/v1?model=m")
    assert json.dumps(load_config("tiny-cpu", [(key, value)]).model_dump()).count("127.0.0.1:9/v1?model=m") == 1


@pytest.mark.parametrize("path", ENV_FIELDS, ids=dotted)
def test_env_name_fields_refuse_a_key_without_echoing_it(path: Path_) -> None:
    for bad in KEYS:
        with pytest.raises(ConfigError) as err:
            load_config("tiny-cpu", [override(path, bad)])
        msg = str(err.value)
        assert msg.startswith(dotted(path) + ": must name the environment variable"), msg
        assert "SECRET" not in msg and "\n" not in msg, msg
    for good in ("MY_JUDGE_KEY", "HF_TOKEN", "key2"):
        cfg = load_config("tiny-cpu", [override(path, good)])
        assert good in json.dumps(cfg.model_dump())


def test_direct_construction_and_assignment_never_show_the_value() -> None:
    with pytest.raises(ValidationError) as err:
        JudgeConfig(api_key_env="sk-SECRET0123456789abcdef")
    assert "api_key_env" in str(err.value) and "SECRET" not in str(err.value)
    cfg = ArborConfig()
    with pytest.raises(ValidationError) as err:
        cfg.tracking.mlflow_tracking_uri = "http://u:SECRET@h"
    assert "mlflow_tracking_uri" in str(err.value) and "SECRET" not in str(err.value)
    assert cfg.tracking.mlflow_tracking_uri is None
    cfg.tracking.mlflow_tracking_uri = "sqlite:///tmp/mlflow.db"  # a store without a credential is a URL too


def test_a_key_on_resume_is_refused_before_it_is_applied() -> None:
    stored = load_config("tiny-cpu")
    stored.run.run_id = "r1"
    for bad in (["judge.api_key_env=sk-SECRET0123456789abcdef"], ["judge.base_url=http://u:SECRET@h/v1"],
                ["tracking.mlflow_tracking_uri=http://u:SECRET@h"]):
        with pytest.raises(ConfigError) as err:
            amend_config(stored, bad)
        assert bad[0].split("=")[0] in str(err.value) and "SECRET" not in str(err.value), str(err.value)
    assert stored.judge.api_key_env == "OPENAI_API_KEY"


def test_cli_refuses_a_credential_in_one_line_and_stores_nothing(tmp_path: Path) -> None:
    """``arbor train`` with a credentialed tracking URI, and a resume given a key for a variable's name: exit 2, one
    line naming the key, the secret nowhere in the output or the workspace."""
    home = tmp_path / "home"
    env = {**os.environ, "ARBOR_HOME": str(home), "PREFECT_HOME": str(tmp_path / "prefect")}
    arbor = str(Path(sys.executable).parent / "arbor")
    from arbor.storage.parquet import write_stage
    from arbor.storage.runs import run_row

    cfg = load_config("tiny-cpu")
    cfg.run.run_id = "r1"
    write_stage("runs", [{"profile": "tiny-cpu", "method": "arbor", "seed": 0, "config_json": cfg.to_json(),
                          "created_at": time.time()}], run_id="r1", step=0, stage="run", home=home)
    before = run_row("r1", home)
    for args, key in ((["--set", "tracking.mlflow_tracking_uri=http://u:SECRET@h:5000"], "tracking.mlflow_tracking_uri"),
                      (["--resume", "r1", "--set", "judge.api_key_env=sk-SECRET0123456789"], "judge.api_key_env")):
        out = subprocess.run([arbor, "train", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and key in out.stderr, out.stderr[-2000:]
        assert "SECRET" not in out.stdout + out.stderr
    assert run_row("r1", home) == before
    assert not any(b"SECRET" in p.read_bytes() for p in home.rglob("*") if p.is_file())
