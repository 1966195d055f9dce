"""arbor's tasks, by concern: the folder tree says where a thing lives.

    env/         the environment: agent loop, datasets and their source plug-ins, search, rollout engines,
                 policy loading, SFT data
    training/    the training machinery: the update a controller decides, losses, trainers, checkpoints, weight sync
    methods/     one module or package per method, with its mathematics, state and tables (ARBOR's memory and
                 judging, SS-GRPO's stagewise credit, RubricEM's bank, ARCO's rubric model, Co-ReAct's guidance)
    reporting/   evaluation, the run report, learning curves, trackers

and, here, what several of them share: the shaping of eq. 3/4 (``shaping``), RubricEM's reflection parts the SFT
data also uses (``reflection``), the stage store (``stages``) and one RL step's stage machinery (``step``). The
record types, the tag protocol and format gate, the base reward and group statistics every layer reads are the base
layer's (``arbor/types.py``, ``arbor/format.py``, ``arbor/reward.py``, ``arbor/group_stats.py``).
"""
