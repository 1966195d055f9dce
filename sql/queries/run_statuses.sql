-- run_statuses: every run's status, last completed step and owner as the run_status view records them, oldest first
-- (arbor runs then decides running vs crashed from the owner)?
select * from run_status order by created_at
