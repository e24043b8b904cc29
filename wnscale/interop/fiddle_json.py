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
strings, and `xarray.Dataset`s. Nothing is imported or called.
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
_PATH_ELEMENT = re.compile(r"^(Index\(index=(?P<index>\d+)\)|Key\(key='(?P<key>.*)'\)|"
                           r"Attr\(name='(?P<attr>.*)'\))$")


class Symbol(str):
  """A Python symbol a config refers to, as "module.name" (e.g. "jax.nn.swish")."""

  @property
  def name(self) -> str:
    """The last part: a class, function or enum member's own name."""
    return self.rpartition(".")[2]


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
      return Symbol(f"{value['module']}.{value['name']}")
    if isinstance(kind, dict) and kind.get("type") == "pyref":
      return self._object(Symbol(f"{kind['module']}.{kind['name']}"), value)
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


def _path_element(text: str, path: str):
  """`Index(index=3)` -> 3; `Key(key='a')`, `Attr(name='a')` -> 'a'."""
  match = _PATH_ELEMENT.match(text)
  if not match:
    raise UserError(f"{path}: an unknown path element {text!r}")
  index = match.group("index")
  return int(index) if index is not None else match.group("key") or match.group("attr")
