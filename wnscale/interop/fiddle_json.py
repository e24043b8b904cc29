"""Fiddle's JSON serialization (`fdl_serialization.dump_json`), read without fiddle.

WeatherNext 2 ships its model configs as fiddle `Buildable`s dumped to JSON.
The file is a graph of objects: `root` refers to one, `objects` holds them by
key, and a value is one of
  {"type": "ref", "key": K}                     another object
  {"type": "leaf", "value": V}                  a JSON value
  {"type": "pyref", "module": M, "name": N}     a Python symbol (a class, a
                                                function, an enum member)
  {"type": <pyref of a type>, "items": [[path element, value], ...],
   "metadata": ...}                             an object of that type
The types are builtins' `tuple`, `list` and `dict` (path elements `Index(index=i)`,
`Key(key='k')`), fiddle's `Config` and `Partial` (path elements
`Attr(name='a')`; the metadata names the function or class and the argument
names) and xarray's `Dataset` (one `Attr(name='data')`: `Dataset.to_dict()`).

`load` turns the graph into plain Python: tuples, lists, dicts, `Buildable`s
(`fn` the symbol as "module.name", `arguments` a dict), symbols as `Symbol`
strings, and `xarray.Dataset`s. Nothing is imported or called. `dump` is the way
back: that plain Python as the JSON that fiddle's `load_json` reads (every object
once, unshared; fiddle's "paths" annotations, which it does not read, left out).
"""

from __future__ import annotations

import dataclasses
import json
import re

import xarray as xr

from wnscale import paths
from wnscale.errors import UserError

_BUILDABLES = {"fiddle._src.config.Config": "Config",
               "fiddle._src.partial.Partial": "Partial"}
_VERSION = "0.0.1"  # fiddle's serialization format
_PATH_ELEMENT = re.compile(r"^(Index\(index=(?P<index>\d+)\)|Key\(key='(?P<key>.*)'\)|"
                           r"Attr\(name='(?P<attr>.*)'\))$")


class Symbol(str):
  """A Python symbol a config refers to, as "module.name" (e.g. "jax.nn.swish"), made of
  its `module` and its `qualname` within it (e.g. "ConnectivityType.BALL_QUERY")."""

  module: str
  qualname: str

  def __new__(cls, module: str, qualname: str):
    symbol = super().__new__(cls, f"{module}.{qualname}")
    symbol.module, symbol.qualname = module, qualname
    return symbol

  def __getnewargs__(self):  # copies and pickles
    return self.module, self.qualname

  @property
  def name(self) -> str:
    """The last part: a class, function or enum member's own name."""
    return self.rpartition(".")[2]


_METADATA = Symbol("fiddle._src.config", "BuildableTraverserMetadata")


@dataclasses.dataclass(frozen=True)
class Buildable:
  """A fiddle `Config` (`kind` "Config": calls `fn`) or `Partial` (binds its arguments)."""

  kind: str
  fn: Symbol
  arguments: dict


def load(path: str):
  """The config at `path` (local or URL) as plain Python; a `UserError` if it is none."""
  try:
    document = json.loads(paths.read_bytes(paths.normalize(path)))
    root, objects = document["root"], document["objects"]
  except (ValueError, KeyError, TypeError) as error:
    raise UserError(f"{path} is not a fiddle JSON config (a 'root' and 'objects'): "
                    f"{error}") from error
  return _Decoder(objects, path).value(root)


class _Decoder:
  """Decodes values, each shared object once (fiddle shares objects by reference)."""

  def __init__(self, objects: dict, path: str):
    self.objects, self.path, self.decoded = objects, path, {}

  def value(self, value):
    if not isinstance(value, dict):
      return value
    kind = value.get("type")
    if kind == "ref":
      key = value["key"]
      if key not in self.decoded:
        if key not in self.objects:
          raise UserError(f"{self.path}: a reference to the missing object {key!r}")
        self.decoded[key] = self.value(self.objects[key])
      return self.decoded[key]
    if kind == "leaf":
      return value["value"]
    if kind == "pyref":
      return Symbol(value["module"], value["name"])
    if isinstance(kind, dict) and kind.get("type") == "pyref":
      return self._object(Symbol(kind["module"], kind["name"]), value)
    raise UserError(f"{self.path}: a value of unknown form {str(value)[:120]}")

  def _object(self, type_name: Symbol, value: dict):
    items = [(_path_element(element, self.path), self.value(item))
             for element, item in value.get("items", ())]
    if type_name in ("builtins.tuple", "builtins.list"):
      values = [item for _, item in sorted(items, key=lambda pair: pair[0])]
      return tuple(values) if type_name == "builtins.tuple" else values
    if type_name == "builtins.dict":
      return dict(items)
    if type_name == "xarray.core.dataset.Dataset":
      return xr.Dataset.from_dict(dict(items)["data"])
    if type_name in _BUILDABLES:
      metadata = self.value(value["metadata"])
      fn = metadata.arguments["fn_or_cls"]
      return Buildable(_BUILDABLES[type_name], fn, dict(items))
    if type_name == "fiddle._src.config.BuildableTraverserMetadata":
      return Buildable("Metadata", type_name, dict(items))
    raise UserError(f"{self.path}: an object of type {type_name}, which this reader does not "
                    "know")


def dump(value) -> str:
  """The fiddle JSON of `value` (what `load` returns: plain Python, `Buildable`s, `Symbol`s,
  `xarray.Dataset`s); fiddle's `load_json` reads it back as the Buildable it describes."""
  encoder = _Encoder()
  root = encoder.value(value)
  return json.dumps({"root": root, "objects": encoder.objects,
                     "refcounts": {key: 1 for key in encoder.objects}, "version": _VERSION})


class _Encoder:
  """Encodes values, each container as an object of its own (`objects`, by key)."""

  def __init__(self):
    self.objects, self.counts = {}, {}

  def value(self, value):
    if isinstance(value, Symbol):
      return _pyref(value)
    if isinstance(value, Buildable):
      return self._buildable(value)
    if isinstance(value, (tuple, list)):
      return self._object(type(value).__name__, Symbol("builtins", type(value).__name__),
                          [(f"Index(index={i})", item) for i, item in enumerate(value)], None)
    if isinstance(value, dict):
      return self._object("dict", Symbol("builtins", "dict"),
                          [(f"Key(key={key!r})", item) for key, item in value.items()],
                          self.value(tuple(value)))
    if isinstance(value, xr.Dataset):
      return self._object("dataset", Symbol("xarray.core.dataset", "Dataset"),
                          [("Attr(name='data')", value.to_dict())], None)
    if value is None or isinstance(value, (bool, int, float, str)):
      return {"type": "leaf", "value": value}
    raise TypeError(f"A value fiddle's JSON cannot hold: {value!r}")

  def _buildable(self, buildable: Buildable) -> dict:
    kind = next(name for name, kind in _BUILDABLES.items() if kind == buildable.kind)
    names = tuple(buildable.arguments)
    metadata = self._object("buildable_traverser_metadata", _METADATA, [
        ("Attr(name='fn_or_cls')", buildable.fn), ("Attr(name='argument_names')", names),
        ("Attr(name='argument_tags')", {}), ("Attr(name='argument_history')", {})],
                            _pyref(_METADATA))
    module, _, qualname = kind.rpartition(".")
    return self._object(_snake(buildable.fn.name), Symbol(module, qualname),
                        list(buildable.arguments.items()), metadata,
                        element=lambda name: f"Attr(name={name!r})")

  def _object(self, prefix: str, type_symbol: Symbol, items, metadata, element=None) -> dict:
    """A reference to a new object of `type_symbol` holding `items` (`[(path element,
    value)]`, or `[(name, value)]` with `element` making the path element of a name)."""
    encoded = [[element(name) if element else name, self.value(item)] for name, item in items]
    self.counts[prefix] = self.counts.get(prefix, 0) + 1
    key = f"{prefix}_{self.counts[prefix]}"
    self.objects[key] = {"type": _pyref(type_symbol), "items": encoded, "metadata": metadata}
    return {"type": "ref", "key": key}


def _pyref(symbol: Symbol) -> dict:
  return {"type": "pyref", "module": symbol.module, "name": symbol.qualname}


def _snake(name: str) -> str:
  """`PredictorConfig` -> `predictor_config` (fiddle's object keys)."""
  return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _path_element(text: str, path: str):
  """`Index(index=3)` -> 3; `Key(key='a')`, `Attr(name='a')` -> 'a'."""
  match = _PATH_ELEMENT.match(text)
  if not match:
    raise UserError(f"{path}: an unknown path element {text!r}")
  index = match.group("index")
  return int(index) if index is not None else match.group("key") or match.group("attr")
