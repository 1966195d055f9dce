"""The run's runtime machinery: the one stop path (``stop``), dependency liveness and the watchdog, the temporary
Prefect API server the CLI starts, quieting libraries, and Retry-After parsing."""
