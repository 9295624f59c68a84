"""Import-time stand-in for torchvision: every torchvision.* module imports, every name is a class
that refuses to be built."""

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.28.0"


class _AbsentMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _Absent(metaclass=_AbsentMeta):
    def __init__(self, *a: Any, **k: Any) -> None:
        raise RuntimeError("torchvision is absent")

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Absent


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
        return mod

    def exec_module(self, module: Any) -> None:
        return None


sys.meta_path.insert(0, _Finder())
