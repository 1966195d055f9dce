-- judge_signal_quality_of_run: is the judge of run $run_id helping? Per step and active rubric: its verdicts'
-- agreement with the outcome order in mixed groups, what shaping moved in zero-variance groups, and the step's
-- drafts admitted and rejected by reason (view judge_signal_quality).
select step, rubric_id, mixed_groups, agree, disagree, ties, failed, agreement_rate, zero_var_activations,
       zero_var_kept, zero_var_groups, zero_var_groups_shaped, zero_var_shaped_share, zero_var_mean_abs_shift,
       drafts_induced, drafts_admitted, drafts_rejected, rejected_variance, rejected_pearson, rejected_other,
       drafts_judge_error
from judge_signal_quality
where run_id = $run_id
order by step, rubric_id nulls first
