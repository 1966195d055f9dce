-- judge_attempts_by_role: per judge role of run $run_id, how many calls were sent, how many ended in a usable answer,
-- how many were answered at the first attempt, how many attempts they took, how many attempts ended in each
-- kind of error (invalid output, a reply cut off at max_tokens, anything else), and the commonest reasons replies
-- were refused? Cache hits are left out: nothing was sent.
-- Invalid output counts both replies that did not validate (InvalidOutput) and replies that validated but were no
-- answer, the prompt's template echoed or a loop (InvalidAnswer; written InvalidAnswer:<reason>
-- now). top_reasons: up to three refusal reasons of the role's attempts with their counts, commonest
-- first ("placeholder_words 3, echo 1"): InvalidAnswer's reason, unparseable (InvalidOutput), truncated.
with sent as (select * from judge_calls where run_id = $run_id and not coalesce(cache_hit, false) and attempts > 0),
tries as (select role, unnest(attempt_errors) as e from sent),
kinds as (select role, split_part(e, ':', 1) as kind,
                 case when split_part(e, ':', 1) = 'InvalidAnswer' then coalesce(nullif(split_part(e, ':', 2), ''), 'hollow')
                      when e = 'InvalidOutput' then 'unparseable'
                      when e = 'Truncated' then 'truncated' end as reason
          from tries),
reasons as (select role, reason, count(*) as n,
                   row_number() over (partition by role order by count(*) desc, reason) as rank
            from kinds where reason is not null group by role, reason)
select s.role, count(*) as calls, count(*) filter (where s.error is null) as valid,
       count(*) filter (where s.error is null) / count(*) as valid_rate,
       count(*) filter (where s.attempt_errors[1] is null) as first_attempt_valid,
       avg(s.attempts) as mean_attempts,
       (select count(*) from kinds t where t.role = s.role and t.kind in ('InvalidOutput', 'InvalidAnswer')) as invalid_attempts,
       (select count(*) from kinds t where t.role = s.role and t.kind = 'Truncated') as truncated_attempts,
       (select count(*) from kinds t where t.role = s.role and t.kind not in ('InvalidOutput', 'InvalidAnswer', 'Truncated'))
           as other_failed_attempts,
       (select string_agg(r.reason || ' ' || r.n, ', ' order by r.rank) from reasons r
        where r.role = s.role and r.rank <= 3) as top_reasons
from sent s
group by s.role
order by s.role
