"""The training machinery: the update a controller decides (``update``), the losses (``losses``), the policy
trainer on DeepSpeed (``train``) and its long-lived service (``trainer_service``), the SFT warm start (``sft``),
LoRA (``lora``), checkpoints (``checkpoint``) and weight sync to the rollout engine (``weight_sync``). The
trainers know no method (issue 32 item 2)."""
