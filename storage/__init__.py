"""arbor storage (docs/architecture.md): Parquet as the source of truth (``storage.parquet``), a DuckDB catalog of views over
it (``storage.catalog``, DDL in ``sql/``), read-only SQL (``storage.sql``) and great-expectations checks
(``storage.validation``). Table schemas: ``storage.schemas``."""
