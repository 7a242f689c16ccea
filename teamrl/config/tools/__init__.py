"""Generic loading, validation and documentation of dataclass-based configs.

A config is a tree of ``@dataclass(kw_only=True)`` classes whose fields all
have defaults and are documented by a string literal placed directly under
the field (an *attribute docstring*)::

    @dataclass(kw_only=True)
    class OptimConfig:
        lr: float = 1e-5
        \"\"\"AdamW learning rate.\"\"\"

Values are validated by pydantic in strict mode with YAML's (JSON's) data
model: an int is a float, a list is a tuple, a mapping is a dataclass, and
nothing else is coerced (no ``"3"`` for an int, no ``1`` for a bool).  This
module knows nothing about any particular schema.  It provides:

* :func:`from_dict` -- validate a plain nested mapping (as read from YAML)
  against a dataclass type and build the instance.  Every problem found
  anywhere in the tree is collected and raised once as :class:`ConfigError`,
  one line per problem naming its dotted key.
* :class:`Sections` -- base of a config whose keys, beside its own fields,
  are sections named after registered plug-ins (``task.<name>``), each
  validated against the config class its plug-in registered.
* :func:`written` -- inside :func:`from_dict`, the data as written, for rules that tell the user's
  entries from the defaults (teamrl's names check).
* :func:`to_dict` -- the inverse: a dataclass instance as plain YAML-safe data.
* :func:`parse_overrides` / :func:`merge` -- ``a.b=value`` command-line
  overrides and deep merging of nested mappings.
* :func:`load` -- YAML file + overrides -> validated config.
* :func:`field_docs` / :func:`describe` -- field documentation, and a
  human-readable listing of every key of a config type.

Modules: ``validate`` (from_dict), ``sections``, ``yamlio`` (load, overrides, merge), ``docs``
(field_docs, describe), ``introspect`` (what they need to know about config types), ``errors``.
"""

from __future__ import annotations

from teamrl.config.tools.docs import describe, field_docs
from teamrl.config.tools.errors import ConfigError
from teamrl.config.tools.sections import Sections
from teamrl.config.tools.validate import from_dict, to_dict, written
from teamrl.config.tools.yamlio import load, merge, parse_overrides, sources

__all__ = [
    "ConfigError",
    "Sections",
    "describe",
    "field_docs",
    "from_dict",
    "load",
    "merge",
    "parse_overrides",
    "sources",
    "to_dict",
    "written",
]
