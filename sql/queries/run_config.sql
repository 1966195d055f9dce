-- run_config: the resolved config (JSON) run $run_id recorded, e.g. where its checkpoints live (arbor runs, export)?
select config_json from runs where run_id = $run_id
