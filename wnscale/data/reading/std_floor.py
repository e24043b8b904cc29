"""The floor under a normalization std, shared by the grid's statistics (`normalization`) and
the observations' (`observations`): a constant field (a synthetic level, a station that never
changes) would otherwise divide by zero."""

import numpy as np

# A std below max(STD_FLOOR_ABSOLUTE, STD_FLOOR_RELATIVE * |mean|) is raised to it.
STD_FLOOR_ABSOLUTE = 1e-12
STD_FLOOR_RELATIVE = 1e-6


def floor_std(std, mean):
  """`std` raised to max(STD_FLOOR_ABSOLUTE, STD_FLOOR_RELATIVE * |mean|) (arrays of one
  shape, or broadcasting)."""
  return np.maximum(std, np.maximum(STD_FLOOR_ABSOLUTE,
                                    STD_FLOOR_RELATIVE * np.abs(mean)))
