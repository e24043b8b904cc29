"""Static node and edge features, as in GraphCast.

* nodes: cos(latitude), sin(longitude), cos(longitude);
* edges: length and 3-D displacement (sender minus receiver) expressed in the
  receiver's local frame (the receiver rotated to latitude 0, longitude 0), all
  divided by the longest edge of the edge set.
"""

from __future__ import annotations

import numpy as np

from wnscale.graphs.grid import xyz_to_lat_lon

NODE_FEATURES = 3
EDGE_FEATURES = 4


def node_features(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
  """`[num_nodes, 3]` float32: cos lat, sin lon, cos lon."""
  lat, lon = np.deg2rad(lat_deg), np.deg2rad(lon_deg)
  return np.stack([np.cos(lat), np.sin(lon), np.cos(lon)], axis=-1).astype(np.float32)


def _to_receiver_frame(points: np.ndarray, receiver_xyz: np.ndarray) -> np.ndarray:
  """Rotates each point so that its receiver lands on (1, 0, 0).

  The rotation is longitude -lon about z, then latitude +lat about y, per edge.
  """
  lat, lon = (np.deg2rad(a) for a in xyz_to_lat_lon(receiver_xyz))
  x, y, z = points[:, 0], points[:, 1], points[:, 2]
  cos_lon, sin_lon = np.cos(lon), np.sin(lon)
  x1 = cos_lon * x + sin_lon * y
  y1 = -sin_lon * x + cos_lon * y
  cos_lat, sin_lat = np.cos(lat), np.sin(lat)
  x2 = cos_lat * x1 + sin_lat * z
  z2 = -sin_lat * x1 + cos_lat * z
  return np.stack([x2, y1, z2], axis=-1)


def edge_features(sender_xyz: np.ndarray, receiver_xyz: np.ndarray,
                  block: int = 1 << 20) -> np.ndarray:
  """`[num_edges, 4]` float32: length, dx, dy, dz in the receiver frame, / longest edge.

  Args:
    sender_xyz, receiver_xyz: `[num_edges, 3]` unit vectors of each edge's ends.
  """
  features = np.empty((len(sender_xyz), EDGE_FEATURES), dtype=np.float64)
  for start in range(0, len(sender_xyz), block):
    s, r = sender_xyz[start:start + block], receiver_xyz[start:start + block]
    displacement = _to_receiver_frame(s, r) - _to_receiver_frame(r, r)
    features[start:start + block, 0] = np.linalg.norm(displacement, axis=-1)
    features[start:start + block, 1:] = displacement
  longest = features[:, 0].max() if len(features) else 1.0
  return (features / longest).astype(np.float32)
