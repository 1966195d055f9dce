"""Base class for config sections: typed, strict (unknown keys refused by name), validated on assignment."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


IMPORT_PATH_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # a plug-in: 'pkg.module:Name' (arbor.plugins)


def builtin_or_plugin(value: str, builtins: tuple[str, ...]) -> str:
    """``value`` if it is one of ``builtins`` or a plug-in import path (issue 14); ``ValueError`` otherwise."""
    if value not in builtins and not re.match(IMPORT_PATH_PATTERN, value):
        raise ValueError(f"expected one of {', '.join(builtins)} or a plug-in 'pkg.module:Class'")
    return value


CREDENTIAL_REFUSAL = "carries a credential"  # endpoint_url's refusal: its error never echoes the value
# query parameters that carry a credential by their name (``?api_key=``, ``?access_token=``, ``?sig=``)
_SECRET_QUERY = re.compile(r"key|token|secret|passw|auth|sig|credential", re.IGNORECASE)


def endpoint_url(value: str | None) -> str | None:
    """A server's URL as it may be stored with a run (its config, the ``runs`` row, the logs): ``ValueError`` when
    it carries a credential (``user:password@``, a ``?api_key=``-like parameter); the key belongs in the
    environment variable the section's ``api_key_env`` names."""
    if value is None:
        return value
    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(value)
    names = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_QUERY.search(k)]
    if parts.username is not None or parts.password is not None or names:
        what = "user:password@" if parts.username is not None else f"the query parameter {names[0]!r}"
        raise ValueError(f"{CREDENTIAL_REFUSAL} ({what}), which would be stored with the run (its config, Parquet, "
                         "logs): give the URL without it and the key in the environment variable named by "
                         "api_key_env")
    return value


# an endpoint's URL field: refused when it carries a credential (``endpoint_url``)
EndpointUrl = Annotated[str | None, AfterValidator(endpoint_url)]
