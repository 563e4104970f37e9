"""TensorFlow's API modules (tf.data, tf.compat.v1, tf.raw_ops, ...) loaded when code first uses them.

TensorFlow's `__init__` imports every module of its public API, and those import the code behind them: a rank
loaded 2,324 modules to start, of which the trainer and Horovod need 1,320 (tf.compat.v1 alone brought 591 for
the two names Horovod reads from it), and the import took 1.81 s on a core instead of 1.31 (docs/benchmark.md).
After `install()`, each API module that is imported is a stand-in until it is used: a name that the module only
imports is imported alone, and anything else imports the module, which takes the stand-in's place.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

API_PACKAGE = "tensorflow._api.v2"  # what `tf.data` and the rest are, as modules
# In a generated API module: a line that imports one name, and the names that its other code sets or changes.
IMPORT_LINE = re.compile(r"^from ([\w.]+) import (\w+)(?: as (\w+))?(?: *#.*)?$", re.MULTILINE)
SET_BY_CODE = re.compile(r"_current_module\.(\w+)|setattr\(_current_module, \"(\w+)\"")
DOCSTRING = re.compile(r'^"""[^"]*"""$', re.MULTILINE)
NAMELESS_LINE = re.compile(  # blank, a comment, `import sys as _sys`, and the four lines of a v1 module's wrapper
    r'\s*(#.*)?$|import \w+ as _\w+$|if not isinstance\(_sys\.modules\[__name__\], _module_wrapper\.TFModuleWrapper\):$'
    r'|\s+_sys\.modules\[__name__\] = _module_wrapper\.TFModuleWrapper\($'
    r'|\s+_sys\.modules\[__name__\], "[\w.]*", public_apis=None, deprecation=False,$'
    r'|\s+has_lite=(True|False)\)$')
# What a module has from its spec; anything else in a stand-in's namespace was put there by its use or by others.
SPEC_ATTRIBUTES = frozenset({"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__file__",
                             "__cached__", "__path__"})
NAMESAKE_PACKAGES = ("distribute", "lite")  # tensorflow/distribute/ and tf.distribute, ...
NAMESAKE_READER = "tensorflow.python.distribute.experimental.rpc.rpc_ops"
_loaded: set[str] = set()  # the API modules that code has used, by name
_swap = threading.Lock()  # held while a stand-in leaves sys.modules, never across an import


class ApiModuleOnUse(types.ModuleType):
    """Stands in for one of TensorFlow's API modules until code uses something that only its code makes.

    A name that the module only imports (`tf.compat.v1.global_variables`, `tf.compat.v1.train`) is imported
    by itself, from the line of the module's generated `__init__` that imports it.
    """

    def __getattr__(self, attr: str) -> Any:
        if self.__name__ in _loaded:  # a stand-in kept by someone after its load hands everything on
            return getattr(load(self.__name__), attr)
        if "_in_place" not in self.__dict__:  # the import system looks attributes up on a new module
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        names, closed = generated_names(self.__file__)
        if attr in names:
            module, name = names[attr]
            value = (importlib.import_module(f"{module}.{name}") if module == self.__name__
                     else getattr(importlib.import_module(module), name))
            setattr(self, attr, value)
            return value
        if closed or (attr.startswith("__") and attr != "__all__"):
            # inspect.getmodule asks every module for its dunders; none of them is a reason to load one
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        return getattr(load(self.__name__), attr)

    def __dir__(self) -> list[str]:
        return dir(load(self.__name__))


@functools.cache
def generated_names(path: str) -> tuple[dict[str, tuple[str, str]], bool]:
    """What the generated API module at `path` binds by importing it, by name: (the module it is in, its name
    there), less the names that its other code sets or changes; and whether those are all the names it has
    (nothing but import lines, and TensorFlow's wrapper of a tf.compat.v1 module, which adds none). Read from
    its text, so that a name can be imported without running the module's hundreds of other imports."""
    text = Path(path).read_text()
    names = {alias or name: (module, name) for module, name, alias in IMPORT_LINE.findall(text)}
    for set_by_code in SET_BY_CODE.findall(text):
        names.pop("".join(set_by_code), None)
    code = DOCSTRING.sub("", text, count=1)
    closed = all(IMPORT_LINE.match(line) or NAMELESS_LINE.match(line) for line in code.splitlines())
    return names, closed


def load(name: str) -> types.ModuleType:
    """The real API module `name`, imported now if only its stand-in was, and put where the stand-in was, with
    what others set on the stand-in meanwhile (tf.compat.v1's code sets `nn.rnn_cell` and extends `nn.__path__`).

    Threads that load the same module at once: one takes the stand-in out of sys.modules, and the import
    system's own lock of the module makes the others wait for the module it imports."""
    stand_in = sys.modules.get(name)
    if not isinstance(stand_in, ApiModuleOnUse):
        return importlib.import_module(name)
    _loaded.add(name)
    with _swap:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
    module = importlib.import_module(name)  # the real one: the finder passes over a name in _loaded
    for attr, value in list(vars(stand_in).items()):
        if attr not in SPEC_ATTRIBUTES and attr != "_in_place":  # set later than the module's own, as in TensorFlow
            setattr(module, attr, value)
    added = [entry for entry in getattr(stand_in, "__path__", []) if entry not in getattr(module, "__path__", [])]
    if added:
        module.__path__ = [*added, *module.__path__]
    parent, _, attr = name.rpartition(".")
    for holder in (sys.modules.get(parent), sys.modules.get("tensorflow")):
        if holder is not None and holder.__dict__.get(attr) is stand_in:
            setattr(holder, attr, module)
    return module


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of an API module not yet used with a stand-in."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(API_PACKAGE + ".") or name in _loaded:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.origin is None:
            return None
        spec.loader = self  # its file and folder stay the module's: a stand-in imports its submodules as usual
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return ApiModuleOnUse(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["_in_place"] = True  # from now on, a use imports


def install() -> None:
    """From now on, for the rest of the process, TensorFlow's API modules are imported as stand-ins: TensorFlow's
    own import, and later ones too (TensorBoard's summaries import all of tf.compat.v2: 0.5 s at the race's first
    summary when only TensorFlow's import was covered). Called only for a TensorFlow it was tested with
    (startup.hooks_on)."""
    if not any(isinstance(finder, _StandInFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _StandInFinder())


def settle_namesakes() -> None:
    """After TensorFlow's import: import its packages that are named as an API module, and the module that
    reaches into one of them through the `tensorflow` module's attribute, with those attributes pointing at the
    packages meanwhile.

    tensorflow/distribute/ and tensorflow/lite/ hold generated code; rpc_ops reads
    `tensorflow.distribute.experimental.rpc.kernels` attribute by attribute from `tensorflow`. TensorFlow's
    `__init__` imports all three before it binds `tf.distribute` and `tf.lite` to the API's modules; loaded later,
    the first import of a package would rebind its name, and rpc_ops would find the API's `tf.distribute`.
    """
    tf = sys.modules["tensorflow"]
    api = {attr: tf.__dict__[attr] for attr in NAMESAKE_PACKAGES if attr in tf.__dict__}
    try:
        for attr in api:
            setattr(tf, attr, importlib.import_module(f"tensorflow.{attr}"))
        importlib.import_module(NAMESAKE_READER)
    except ModuleNotFoundError:
        pass  # another TensorFlow, without them: nothing to keep apart
    finally:
        for attr, module in api.items():
            setattr(tf, attr, module)
