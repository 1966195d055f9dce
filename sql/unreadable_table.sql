-- unreadable_table: the view of a stored table whose files cannot be read (storage/catalog.py): the table's
-- columns from its _schema.parquet, and reading it raises {{message}}, which names the file. error() sits in a
-- materialized CTE: anywhere else the optimizer prunes it and nothing raises. {{table}}, {{message}} and
-- {{schema}} are bound by storage/catalog.py (quotes doubled).
create or replace view {{table}} as
with failed as materialized (select error('{{message}}') as e)
select s.* from read_parquet('{{schema}}') s, failed
