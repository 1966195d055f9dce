"""The training machinery: the update a controller decides (``update``), the losses (``losses``), the policy
trainer on DeepSpeed (``train``) and its long-lived service (``trainer_service``), the SFT warm start (``sft``),
LoRA (``lora``), checkpoints (``checkpoint``) and weight sync to the rollout engine (``weight_sync``). The
trainers know no method.

The trainer's performance policies each have a module: the chunked policy head (``head``), pi_old from
the forward (``pi_old``), packed micro-batches (``packing``), activation recompute by a memory budget
(``recompute``) and checkpoints written in the background (``checkpoint_async``, driven by ``saver``). The
DeepSpeed engine, its config and the model load are ``engine``'s."""
