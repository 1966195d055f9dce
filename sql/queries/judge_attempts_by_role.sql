-- judge_attempts_by_role: per judge role of run $run_id, how many calls were sent, how many ended in a usable answer,
-- how many were answered at the first attempt, how many attempts they took, and how many attempts ended in each
-- kind of error (invalid output, a reply cut off at max_tokens, anything else)? Cache hits are left out: nothing was sent.
-- Invalid output counts both replies that did not validate (InvalidOutput) and replies that validated but were no
-- answer, the prompt's template echoed or a loop (InvalidAnswer, issue 50 item 9).
with sent as (select * from judge_calls where run_id = $run_id and not coalesce(cache_hit, false) and attempts > 0),
tries as (select role, unnest(attempt_errors) as e from sent)
select s.role, count(*) as calls, count(*) filter (where s.error is null) as valid,
       count(*) filter (where s.error is null) / count(*) as valid_rate,
       count(*) filter (where s.attempt_errors[1] is null) as first_attempt_valid,
       avg(s.attempts) as mean_attempts,
       (select count(*) from tries t where t.role = s.role and t.e in ('InvalidOutput', 'InvalidAnswer')) as invalid_attempts,
       (select count(*) from tries t where t.role = s.role and t.e = 'Truncated') as truncated_attempts,
       (select count(*) from tries t where t.role = s.role and t.e not in ('InvalidOutput', 'InvalidAnswer', 'Truncated'))
           as other_failed_attempts
from sent s
group by s.role
order by s.role
