"""prefect.yaml read as data: GPU deployments share one work pool whose concurrency limit the file
sets, entrypoints are module paths that a pip install can deploy, every profile exists, and every qwen3 train
profile has its SFT deployment. tests/test_deployment.py deploys the file through a real server and worker."""

from __future__ import annotations

import shlex
from functools import cache
from typing import Any

import yaml

from arbor.paths import CONFIGS_DIR, PROJECT_ROOT

SET_LIMIT = ["prefect", "work-pool", "set-concurrency-limit"]


@cache
def spec() -> dict[str, Any]:
    return yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())


def gpu_limit(build: list[dict[str, Any]] | None = None) -> tuple[str, int]:
    """(pool, limit) that a GPU deployment's build step sets (``prefect work-pool set-concurrency-limit POOL N``)."""
    steps = build if build is not None else spec()["definitions"]["gpu_limit"]
    [step] = steps
    argv = shlex.split(step["prefect.deployments.steps.run_shell_script"]["script"])
    assert argv[:3] == SET_LIMIT and len(argv) == 5, argv
    return argv[3], int(argv[4])


@cache
def flow_names() -> dict[str, str]:
    """Each entrypoint's flow name, loaded the way a worker loads a module-path entrypoint."""
    from prefect.flows import load_flow_from_entrypoint

    return {e: load_flow_from_entrypoint(e, use_placeholder_flow=False).name
            for e in {d["entrypoint"] for d in spec()["deployments"]}}


def deployments() -> dict[tuple[str, str], dict[str, Any]]:
    """prefect.yaml's deployments by (flow name, deployment name), as `prefect deployment run` names them."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for d in spec()["deployments"]:
        key = (flow_names()[d["entrypoint"]], d["name"])
        assert key not in out, f"{key} is deployed twice"
        out[key] = d
    return out


def is_gpu(dep: dict[str, Any]) -> bool:
    return str(dep["parameters"]["profile"]).startswith("qwen3")


def test_gpu_deployments_share_one_pool_limit() -> None:
    pool, limit = gpu_limit()
    assert limit == 1 and pool == spec()["definitions"]["work_pools"]["gpu"]["name"]
    gpu = {k: d for k, d in deployments().items() if is_gpu(d)}
    assert len(gpu) >= 15, sorted(gpu)
    for key, dep in deployments().items():
        assert "concurrency_limit" not in dep, f"{key}: a deployment's own limit is not shared (use the pool's)"
        if is_gpu(dep):
            assert dep["work_pool"]["name"] == pool, key
            assert gpu_limit(dep.get("build")) == (pool, limit), key  # deploying it sets the pool's limit
        else:
            assert dep["work_pool"]["name"] != pool and not dep.get("build"), key  # CPU: another pool, no limit


def test_entrypoints_are_module_paths_to_flows() -> None:
    """A module path (`arbor.flows.train.arbor_train`, no `file.py:`) deploys from any directory where arbor is
    installed; nothing in the pull steps points into a checkout."""
    from arbor.flows.evaluate import arbor_eval
    from arbor.flows.guidance import arbor_guidance_train
    from arbor.flows.sft import arbor_sft
    from arbor.flows.train import arbor_train

    expected = {f"arbor.flows.{m}.{f.fn.__name__}": f.name for m, f in (
        ("train", arbor_train), ("sft", arbor_sft), ("evaluate", arbor_eval), ("guidance", arbor_guidance_train))}
    for entry in {d["entrypoint"] for d in spec()["deployments"]}:
        assert ":" not in entry and ".py" not in entry and entry.startswith("arbor."), entry
    assert flow_names() == expected
    pull = yaml.safe_dump(spec().get("pull"))
    assert "ARBOR_PROJECT_DIR" not in pull and "set_working_directory" not in pull, pull


def test_every_profile_exists_and_loads() -> None:
    from arbor.config import load_config

    for key, dep in deployments().items():
        profile = dep["parameters"]["profile"]
        assert (CONFIGS_DIR / f"{profile}.yaml").is_file(), (key, profile)
        assert load_config(profile, dep["parameters"].get("overrides")).run.profile == profile, key


def test_each_train_profile_has_its_sft_deployment() -> None:
    deps = deployments()
    trained = sorted(name for flow, name in deps if flow == "arbor-train")
    assert {"qwen3-4b", "qwen3-8b", "qwen3-14b", "tiny-world"} <= set(trained), trained
    for name in [n for n in trained if n.startswith("qwen3") or n == "tiny-world"]:  # four at least (above)
        sft = deps.get(("arbor-sft", name))
        assert sft is not None, f"arbor-train/{name} has no arbor-sft/{name}"
        assert sft["parameters"]["profile"] == deps[("arbor-train", name)]["parameters"]["profile"]


def test_no_secret_is_resolved_into_a_deployment() -> None:
    """`prefect deploy` resolves `{{ prefect.blocks.secret.* }}` and `{{ $VAR }}` in a deployment's job_variables
    and stores the value in the deployment: keys go into the worker's or the pool's environment instead."""
    pools = [*spec()["definitions"]["work_pools"].values(), *(d["work_pool"] for d in spec()["deployments"])]
    text = yaml.safe_dump(pools)
    assert "{{" not in text and "key" not in text.lower(), text


def test_documented_flow_parameters_match_the_flows() -> None:
    """prefect.yaml's header lists each flow's parameters (`prefect deployment run ... --param NAME=...`): exactly
    the flow function's, in order."""
    import inspect
    import re

    from arbor.flows.evaluate import arbor_eval
    from arbor.flows.guidance import arbor_guidance_train
    from arbor.flows.sft import arbor_sft
    from arbor.flows.train import arbor_train

    text = (PROJECT_ROOT / "prefect.yaml").read_text()
    listed = {m[1]: [p.strip() for p in m[2].split(",")]
              for m in re.finditer(r"^#\s+(arbor-[a-z-]+): ([a-z_, ]+)$", text, re.M)}
    flows = {f.name: list(inspect.signature(f.fn).parameters) for f in
             (arbor_train, arbor_sft, arbor_eval, arbor_guidance_train)}
    assert listed == flows
    for dep in spec()["deployments"]:  # and every deployment's parameters are its flow's
        name = flow_names()[dep["entrypoint"]]
        assert set(dep["parameters"]) <= set(flows[name]), (name, dep["name"], dep["parameters"])
