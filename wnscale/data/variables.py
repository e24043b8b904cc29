"""The variable catalogue and the channel layout every array in wnscale uses.

A model sees the atmosphere as a stack of channels on the grid. This module
fixes, once, which variables exist, which ones have pressure levels, how they
are flattened into channels, and their GraphCast loss weights.

Layout contract (data pipeline -> model -> loss):
  * grid nodes are flattened latitude-major, latitude ascending (-90 -> 90),
    longitude ascending [0, 360): node `i * num_lon + j` is (lat[i], lon[j]);
  * state channels: the configured variables (`data.variables`, inputs and
    targets) in config order; an atmospheric variable contributes one channel
    per configured pressure level (in config order), a surface variable one
    channel;
  * output channels: the state channels, then those of the target-only
    variables (`data.target_only_variables`: predicted, never inputs);
  * forcing channels: `data.forcings`, in config order, each one channel;
  * statics: `STATIC_VARIABLES`, in that order.
Names are WeatherBench2's and GraphCast's (e.g. `day_progress_sin`), so
statistics files and checkpoints match by name.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wnscale.errors import UserError


@dataclasses.dataclass(frozen=True)
class Variable:
  """One physical variable of the WeatherBench2 layout.

  Attributes:
    name: the WeatherBench2 / ARCO-ERA5 name, e.g. `2m_temperature`.
    atmospheric: True if it has a `level` dimension.
    loss_weight: per-variable weight of the GraphCast loss.
    units: physical units, for logs and RMSE reports.
  """

  name: str
  atmospheric: bool
  loss_weight: float
  units: str


ATMOSPHERIC_VARIABLES = (
    Variable("temperature", True, 1.0, "K"),
    Variable("geopotential", True, 1.0, "m^2 s^-2"),
    Variable("u_component_of_wind", True, 1.0, "m s^-1"),
    Variable("v_component_of_wind", True, 1.0, "m s^-1"),
    Variable("vertical_velocity", True, 1.0, "Pa s^-1"),
    Variable("specific_humidity", True, 1.0, "kg kg^-1"),
)
SURFACE_VARIABLES = (
    Variable("2m_temperature", False, 1.0, "K"),
    Variable("10m_u_component_of_wind", False, 0.1, "m s^-1"),
    Variable("10m_v_component_of_wind", False, 0.1, "m s^-1"),
    Variable("mean_sea_level_pressure", False, 0.1, "Pa"),
    Variable("total_precipitation_6hr", False, 0.1, "m"),
)
# WeatherNext 2's other surface variables (with its loss weights); sea-surface temperature
# is NaN over land (see `data.nan_fill_values`).
WEATHERNEXT2_SURFACE_VARIABLES = (
    Variable("sea_surface_temperature", False, 0.1, "K"),
    Variable("100m_u_component_of_wind", False, 0.05, "m s^-1"),
    Variable("100m_v_component_of_wind", False, 0.05, "m s^-1"),
)
# WeatherNext 2's tropical-cyclone targets (WeatherNextCyclones; target-only): fields
# derived from IBTrACS tracks, NaN away from a cyclone; their loss weights are WeatherNext 2's.
CYCLONE_VARIABLES = (
    Variable("cyclone_exists_gaussian_unit_mode", False, 10.0, "1"),
    Variable("cyclone_all_wind_disc", False, 10.0, "kt"),
    Variable("cyclone_usa_wind_disc", False, 10.0, "kt"),
    *(Variable(f"cyclone_usa_r{speed}_{quadrant}_radius_disc", False, 1.0, "nmile")
      for speed in (34, 50, 64) for quadrant in ("ne", "se", "sw", "nw")),
    Variable("cyclone_usa_rmw_disc", False, 1.0, "nmile"),
    Variable("cyclone_usa_pres_disc", False, 10.0, "hPa"),
)
# GenCast's 12 h precipitation (a target only; its loss weight is GenCast's).
GENCAST_SURFACE_VARIABLES = (Variable("total_precipitation_12hr", False, 0.1, "m"),)
VARIABLES = {v.name: v for v in (ATMOSPHERIC_VARIABLES + SURFACE_VARIABLES
                                 + WEATHERNEXT2_SURFACE_VARIABLES + CYCLONE_VARIABLES
                                 + GENCAST_SURFACE_VARIABLES)}

# Static fields read from the store (time-independent).
SURFACE_GEOPOTENTIAL = "geopotential_at_surface"
STATIC_VARIABLES = (SURFACE_GEOPOTENTIAL, "land_sea_mask")
# ECMWF short names (GRIB's `shortName`, cfgrib's and the CDS netCDF's variable names, the
# params of anemoi-datasets stores built from MARS) -> WeatherBench2 names. `z` on pressure
# levels is geopotential; without levels it is the surface geopotential
# (`SURFACE_GEOPOTENTIAL`).
ECMWF_NAMES = {
    "z": "geopotential", "t": "temperature", "u": "u_component_of_wind",
    "v": "v_component_of_wind", "q": "specific_humidity", "w": "vertical_velocity",
    "2t": "2m_temperature", "t2m": "2m_temperature",
    "10u": "10m_u_component_of_wind", "u10": "10m_u_component_of_wind",
    "10v": "10m_v_component_of_wind", "v10": "10m_v_component_of_wind",
    "msl": "mean_sea_level_pressure", "tp": "total_precipitation",
    "tisr": "toa_incident_solar_radiation", "lsm": "land_sea_mask",
}

# Forcings: known ahead for any time, so fed at the input times and the target time.
# Computed from time and position (`forcings.py`), or read from the store where the
# config says so (`data.stored_forcings`, e.g. ERA5's solar radiation).
FORCING_CHANNELS = (
    "toa_incident_solar_radiation",
    "day_progress_sin",
    "day_progress_cos",
    "year_progress_sin",
    "year_progress_cos",
)

# WeatherBench2's 13 levels and ERA5's 37, in hPa.
WB2_LEVELS_13 = (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000)
ERA5_LEVELS_37 = (
    1, 2, 3, 5, 7, 10, 20, 30, 50, 70, 100, 125, 150, 175, 200, 225, 250, 300,
    350, 400, 450, 500, 550, 600, 650, 700, 750, 775, 800, 825, 850, 875, 900,
    925, 950, 975, 1000,
)


def lookup(name: str) -> Variable:
  """Returns the catalogue entry of `name`, with a clear error if unknown."""
  if name not in VARIABLES:
    raise UserError(
        f"Unknown variable {name!r}; known variables: {sorted(VARIABLES)}")
  return VARIABLES[name]


def is_atmospheric(name: str) -> bool:
  """Whether `name` (a variable, forcing or static) has a `level` dimension.

  Raises a clear error for a name in none of the catalogues.
  """
  if name in FORCING_CHANNELS or name in STATIC_VARIABLES:
    return False
  return lookup(name).atmospheric


def channel_names(variables, levels) -> list[str]:
  """Names of the channels of `variables` (any catalogue names), e.g. `temperature@500`."""
  names = []
  for name in variables:
    if is_atmospheric(name):
      names.extend(f"{name}@{level}" for level in levels)
    else:
      names.append(name)
  return names


def loss_channel_weights(variables, levels, weights: dict | None = None) -> np.ndarray:
  """GraphCast loss weight of each state channel, `[num_channels]` float32.

  A variable's weight (its `loss_weight`, or `weights[name]` where given) is
  shared by its levels in proportion to pressure (level / mean level), so every
  variable counts by its weight alone and the lower atmosphere counts more within it.
  """
  levels = np.asarray(levels, dtype=np.float64)
  level_share = levels / levels.mean() / len(levels) if len(levels) else levels
  channel_weights = []
  for name in variables:
    variable = lookup(name)
    weight = (weights or {}).get(name, variable.loss_weight)
    if variable.atmospheric:
      channel_weights.extend(weight * level_share)
    else:
      channel_weights.append(weight)
  return np.asarray(channel_weights, dtype=np.float32)
