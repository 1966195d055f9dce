"""Base class for config sections: typed, strict (unknown keys refused by name), finite, validated on assignment.

Two kinds of string carry the run's access to other services and so must never carry a secret: a URL (``Url``:
no ``user:password@``, no ``?api_key=``) and the name of an environment variable that holds a key (``EnvName``:
a name, never the key). A field is one of them by its type, which ``string_kind`` reads back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError


class Section(BaseModel):
    # allow_inf_nan: every float is a finite number (an infinite learning rate is never meant);
    # hide_input_in_errors: a refused value (a pasted key) never shows in a ValidationError's text
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False,
                              hide_input_in_errors=True)


IMPORT_PATH_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # a plug-in: 'pkg.module:Name' (arbor.plugins)


def builtin_or_plugin(value: str, builtins: tuple[str, ...]) -> str:
    """``value`` if it is one of ``builtins`` or a plug-in import path; ``ValueError`` otherwise."""
    if value not in builtins and not re.match(IMPORT_PATH_PATTERN, value):
        raise ValueError(f"expected one of {', '.join(builtins)} or a plug-in 'pkg.module:Class'")
    return value


SECRET_ERROR = "secret_value"  # the error type of a refused URL or variable name: its message never shows the value


@dataclass(frozen=True)
class StringKind:
    """A string field's kind, carried in its type (``Url``, ``EnvName``) so a walk over the schema can find it."""

    name: str


URL = StringKind("url")
ENV_NAME = StringKind("env_name")

# query (or fragment) parameters that carry a credential by their name (``?api_key=``, ``?access_token=``, ``?sig=``)
_SECRET_QUERY = re.compile(r"key|token|secret|passw|auth|sig|credential", re.IGNORECASE)


def url_without_credential(value: str) -> str:
    """A URL as it may be stored with a run (its config, the ``runs`` row, the logs): refused when it carries a
    credential (``user:password@``, an ``?api_key=``-like parameter) or cannot be read as a URL."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(value)
        user = parts.username is not None or parts.password is not None
    except ValueError:
        raise PydanticCustomError(SECRET_ERROR, "not a URL (scheme://host[:port]/path)") from None
    names = [k for q in (parts.query, parts.fragment) for k, _ in parse_qsl(q, keep_blank_values=True)
             if _SECRET_QUERY.search(k)]
    if user or names:
        what = "user:password@" if user else f"the query parameter {names[0]!r}"
        raise PydanticCustomError(
            SECRET_ERROR, f"carries a credential ({what}), which would be stored with the run (its config, Parquet, "
            "logs): give the URL without it and the secret in an environment variable (the one api_key_env names, "
            "or the service's own)")
    return value


_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# how API keys begin (OpenAI, Hugging Face, GitHub, GitLab, Slack, Stripe): a key pasted where its variable's name goes
_KEY_PREFIX = re.compile(r"(sk|hf|ghp|gho|ghs|ghu|github_pat|glpat|xox[abpr]|pk|rk)[-_]")


def looks_like_key(value: str) -> bool:
    """Whether ``value`` cannot be a variable's name, or reads as a key: a known key prefix, or a run of 16 or more
    characters without ``_`` that mixes two of lower case, upper case and digits (a random token)."""
    if not _ENV_VAR.fullmatch(value) or _KEY_PREFIX.match(value):
        return True
    return any(len(run) >= 16 and sum(map(bool, (re.search("[a-z]", run), re.search("[A-Z]", run),
                                                  re.search("[0-9]", run)))) >= 2 for run in value.split("_"))


def env_var_name(value: str) -> str:
    """The name of an environment variable that holds a key: refused, without repeating it, when it reads as the
    key itself."""
    if looks_like_key(value):
        raise PydanticCustomError(
            SECRET_ERROR, "must name the environment variable that holds the key (letters, digits and _, e.g. "
            "OPENAI_API_KEY), and this reads as the key itself: export the key as a variable and give its name")
    return value


Url = Annotated[str, AfterValidator(url_without_credential), URL]  # a service's URL: never a credential in it
EnvName = Annotated[str, AfterValidator(env_var_name), ENV_NAME]  # a variable's name: never the key


def string_kind(field: FieldInfo) -> StringKind | None:
    """The ``StringKind`` a field's type carries (``Url``, ``EnvName``, ``Url | None``, ...), or None."""
    stack: list[Any] = [*field.metadata, field.annotation]
    while stack:
        t = stack.pop()
        if isinstance(t, StringKind):
            return t
        if get_origin(t) is Annotated:
            stack += t.__metadata__
        stack += [a for a in get_args(t) if a is not ...]
    return None
