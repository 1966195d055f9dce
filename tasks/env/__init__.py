"""The environment the policy acts in: the agent's turn loop (``agent``), question sets and their sources
(``datasets``, ``sources``, the synthetic ``world``), search backends (``search``), rollout engines and their
serving (``rollout``, ``serving``), policy loading (``policy``), SFT data (``sft_data``) and sentence embeddings
(``embed``)."""
