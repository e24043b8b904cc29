"""Static node and edge features, GraphCast's definition.

* nodes: `[sin(lat), cos(lon), sin(lon)]` (the reference writes the first as
  the cosine of the colatitude);
* edges: `[length, dx, dy, dz]`: the displacement sender minus receiver in the
  receiver's local frame, and its length, all divided by the edge set's
  normalization factor (by default its longest edge, so lengths are in [0, 1]).
  The local frame rotates the receiver to latitude 0, longitude 0, i.e. onto
  (1, 0, 0): first by -lon about z, then by +lat about y. As the frame is
  defined by latitude and longitude, the features are unchanged by a shift of
  every longitude (a rotation about z), not by other rotations of the sphere.

Precision follows the reference, whose features wnscale must reproduce: nodes
are given float32 latitude/longitude; positions (and node features) are computed
from them in float32; the rotation, displacement, length and normalization in
float64 from those; features are rounded to float32 at the end.
"""

from __future__ import annotations

import numpy as np

from wnscale.graphs import blocks

NODE_FEATURES = 3
EDGE_FEATURES = 4


def node_features(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
  """`[num_nodes, 3]` float32: sin lat (as cos of the colatitude), cos lon, sin lon."""
  lon = np.deg2rad(lon_deg)
  colatitude = np.deg2rad(90 - lat_deg)
  return np.stack([np.cos(colatitude), np.cos(lon), np.sin(lon)], -1).astype(np.float32)


def _frame_rotations(lat_deg: np.ndarray, lon_deg: np.ndarray):
  """Per node, `(cos, sin)` of the two angles of its local frame, float64 `[n]` each.

  The angles are -lon and lat = pi/2 - colatitude, formed in the inputs' precision
  (float32), their cosines and sines in float64, as the reference does.
  """
  lon = np.deg2rad(lon_deg)
  lat = np.asarray(np.pi / 2, dtype=lon.dtype) - np.deg2rad(90 - lat_deg)
  lon, lat = lon.astype(np.float64), lat.astype(np.float64)
  return np.cos(lon), np.sin(lon), np.cos(lat), np.sin(lat)


def _to_frame(points: np.ndarray, cos_lon, sin_lon, cos_lat, sin_lat) -> np.ndarray:
  """Rotates `[n, 3]` points by -lon about z, then by +lat about y (row-wise angles)."""
  x, y, z = points[:, 0], points[:, 1], points[:, 2]
  x1 = cos_lon * x + sin_lon * y
  y1 = -sin_lon * x + cos_lon * y
  return np.stack([cos_lat * x1 + sin_lat * z, y1, -sin_lat * x1 + cos_lat * z], axis=-1)


def edge_features(sender_xyz, receiver_xyz, receiver_lat, receiver_lon, senders, receivers,
                  normalization: float | None = None, block: int = 1 << 18) -> np.ndarray:
  """`[num_edges, 4]` float32: length, dx, dy, dz in the receiver's frame, / normalization.

  Args:
    sender_xyz: `[num_sender_nodes, 3]` float32 positions (`grid.lat_lon_to_xyz` of the
      nodes' float32 latitude and longitude).
    receiver_xyz: `[num_receiver_nodes, 3]` likewise.
    receiver_lat, receiver_lon: `[num_receiver_nodes]` float32 degrees (the frames).
    senders, receivers: `[num_edges]` node indices.
    normalization: what the features are divided by; None: the longest edge.
    block: edges per step (`blocks.for_blocks`), to bound the float64 temporaries.
  """
  frames = _frame_rotations(receiver_lat, receiver_lon)
  # The receiver in its own frame is ~(1, 0, 0), not exactly: subtract it as rotated.
  receiver_in_frame = _to_frame(receiver_xyz.astype(np.float64), *frames)
  features = np.empty((len(senders), EDGE_FEATURES), dtype=np.float64)

  def work(rows: slice):
    s, r = senders[rows], receivers[rows]
    displacement = _to_frame(sender_xyz[s].astype(np.float64), *(f[r] for f in frames))
    displacement -= receiver_in_frame[r]
    features[rows, 0] = np.linalg.norm(displacement, axis=-1)
    features[rows, 1:] = displacement

  blocks.for_blocks(len(senders), block, work)
  if normalization is None:
    normalization = features[:, 0].max() if len(features) else 1.0
  return (features / normalization).astype(np.float32)
