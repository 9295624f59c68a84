"""Configuration: :mod:`~kvtier.config.schema` (the typed config, :func:`load_config`,
:func:`parse_size`), :mod:`~kvtier.config.files` (reading JSON/YAML files, bounded),
:mod:`~kvtier.config.layers` (defaults < file < ``KVTIER_*`` environment < arguments) and
:mod:`~kvtier.config.vllm` (vLLM's ``--kv-transfer-config`` in kvtier's terms; imports no vLLM).

Importing the package imports only the schema, as ``kvtier.config`` always did.
"""

from kvtier.config.schema import KvtierConfig, PluginsConfig, TierConfig, load_config, parse_size, row_stride

__all__ = ["KvtierConfig", "PluginsConfig", "TierConfig", "load_config", "parse_size", "row_stride"]
