"""A store's `units` attributes against the catalogue's (`variables.Variable.units`).

A store says what units a variable is in (`units`, as WeatherBench2 and ERA5 write
it); wnscale's statistics, GraphCast's and the model's outputs are in the
catalogue's. `conversion` compares the two: the same units (however spelled: `m**2
s**-2`, `m^2 s^-2`, `m2 s-2`) or units it does not know need nothing; the simple
affine cases are converted on reading (degC and K, hPa and Pa: `(scale, offset)`,
`x * scale + offset`); any other pair it knows is a mismatch, a `UserError` naming
the variable, the store's units and those expected. `read_as` is `conversion` said in
one warning line per store and variable (training, a forecast's initial conditions and
an evaluation's truth say it alike).
"""

from __future__ import annotations

import logging

from wnscale.errors import UserError

# Spellings of each unit known here, normalized (`_normalized`), by a canonical name.
_SPELLINGS = {
    "K": ("k", "kelvin", "degk", "deg_k", "degreesk", "degrees_kelvin"),
    "degC": ("degc", "deg_c", "°c", "c", "celsius", "degreesc", "degree_celsius",
             "degrees_celsius", "degreec"),
    "Pa": ("pa", "pascal", "pascals"),
    "hPa": ("hpa", "mbar", "millibar", "millibars", "mb", "hectopascal", "hectopascals"),
    "m^2 s^-2": ("m2s-2", "m2/s2"),
    "m": ("m", "metre", "meter", "metres", "meters"),
    "m s^-1": ("ms-1", "m/s"),
    "kg kg^-1": ("kgkg-1", "kg/kg"),
    "Pa s^-1": ("pas-1", "pa/s"),
}
_CANONICAL = {spelling: name for name, spellings in _SPELLINGS.items() for spelling in spellings}
# (store's, expected) -> (scale, offset): expected = store's * scale + offset.
_AFFINE = {("degC", "K"): (1.0, 273.15), ("K", "degC"): (1.0, -273.15),
           ("hPa", "Pa"): (100.0, 0.0), ("Pa", "hPa"): (0.01, 0.0)}


def _normalized(units: str) -> str:
  return "".join(str(units).lower().replace("**", "").replace("^", "").split())


def canonical(units) -> str | None:
  """The canonical name of `units` (e.g. "K" for "kelvin"), or None if not known here."""
  if units is None:
    return None
  return _CANONICAL.get(_normalized(units))


def conversion(name: str, store_units, expected: str, path: str
               ) -> tuple[float, float] | None:
  """`(scale, offset)` that turn `name`'s values in the store at `path` (in `store_units`)
  into `expected` units; None when nothing is to be done (the same units, or either
  unknown here).

  Raises:
    UserError: units known here that differ and are not one of the affine pairs.
  """
  have, want = canonical(store_units), canonical(expected)
  if have is None or want is None or have == want:
    return None
  if (have, want) in _AFFINE:
    return _AFFINE[have, want]
  raise UserError(f"Variable {name!r} of store {path} is in {store_units!r} (its units "
                  f"attribute); wnscale expects {expected!r} (its statistics and the model's "
                  f"outputs are in {expected}): convert the store's {name} to {expected}, or "
                  "correct its units attribute if it is wrong.")


_SAID: set[tuple[str, str]] = set()  # (store, variable) conversions said in this process


def read_as(name: str, store_units, expected: str, path: str
            ) -> tuple[float, float] | None:
  """`conversion`, and, the first time for this store and variable, one warning saying
  it, e.g. "Store S: 2m_temperature is in degC (its units attribute): read in K
  (+273.15)."."""
  scale_offset = conversion(name, store_units, expected, path)
  if scale_offset is not None and (path, name) not in _SAID:
    _SAID.add((path, name))
    scale, offset = scale_offset
    how = " ".join(part for part in (f"x {scale:g}" if scale != 1 else "",
                                     f"{offset:+g}" if offset else "") if part)
    logging.warning("Store %s: %s is in %s (its units attribute): read in %s (%s).", path,
                    name, store_units, expected, how)
  return scale_offset
