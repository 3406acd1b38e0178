"""Configuration: YAML files validated into typed dataclasses, with errors that name the key.

- :mod:`~hyperplex.config.core`: the generic machinery (YAML reading, dict → dataclass validation,
  dotted overrides, the reference table), which knows nothing of experiments.
- :mod:`~hyperplex.config.experiment`: the experiment schema (``data``, ``model``, ``training``,
  ``testing``) and loading a config file, with its overrides, into it.
- :mod:`~hyperplex.config.reference`: ``docs/config.md`` and commented config templates, generated
  from the schema.
"""

from hyperplex.config.core import (
    ConfigError,
    dump_yaml,
    from_dict,
    load_yaml,
    located,
    merge,
    parse_overrides,
    reference_markdown,
    to_dict,
)

__all__ = ["ConfigError", "dump_yaml", "from_dict", "load_yaml", "located", "merge", "parse_overrides",
           "reference_markdown", "to_dict"]
