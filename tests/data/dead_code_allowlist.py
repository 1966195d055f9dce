"""Names vulture cannot see used (tests/test_dead_code.py): framework hooks and config fields. Keep it short."""
# ruff: noqa

# typer: the CLI's commands and an enum member
_main, sql_cmd, runs_cmd, disk_cmd, train_cmd, demo_cmd, rubrics_export_cmd, judge_serve_cmd, eval_cmd, report_cmd, compare_cmd
config_show_cmd, guidance_train_cmd, verify_cmd, export_cmd, sft_convert_cmd
parquet
# Prefect flow entry points named in prefect.yaml
arbor_sft
# pydantic: model settings, validators, and config fields read through model_dump() or by key
model_config, _._cross_checks, _._shares_sum_to_one, _._prompt_matches_protocol, _._upper, _._non_empty, _._known_backend
_._causal, _._rank_models, _._council, _._budget_from_window, _._eval_sets
price_in_per_mtok, price_out_per_mtok, induction, consolidation
# attributes set for libraries to read (great-expectations, tokenizers, transformers) and nn.Module.forward
_.progress_bars, _.pre_tokenizer, _.chat_template, _.use_cache, _.forward
# __exit__ arguments
exc, et, tb
# the built-in methods, imported by the strings of tasks.methods.BUILTIN
Arbor, DAPO, NoMemory, RaR, SSGRPO, RubricEM, ARCO
# BankItem fields read through dataclasses.asdict (rubric_bank rows)
source_traj_id, utility
# plug-ins named by import-path strings (tests/test_plugins.py, docs/plugins.md)
KeywordSearch, LenientJudge, em_minus_search_cost
# torch's ProcessGroupNCCL.Options timeout, read by torch (tasks/training/vllm_sync.py, NcclCommunicator)
_._timeout
# DeepSpeed's CheckpointEngine interface, called by engine.save_checkpoint (tasks/training/checkpoint_async.py SnapshotCheckpointEngine)
_.create, _.is_decoupled, _.set_commit_info, _.get_commit_info, _.cleanup, _.preserves_storage_sharing
# registered with atexit (tasks/training/checkpoint_async.py)
_wait_at_exit
# module attribute hooks (PEP 562): a method package loads its method lazily (tasks/methods/arbor, rar)
__getattr__
# judge backends registered by decorator (llm.register_backend; tasks/methods/arbor/world_judge.py)
WorldJudge, RandomJudge
