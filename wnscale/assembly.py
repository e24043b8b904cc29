"""`assemble`: what a config runs on a grid, built in one place for every kind of run.

Training, forecasts, GraphCast example predictions and the memory planner all
need the same pieces for a config on a grid: the graphs, the host constants
(the residual scale comes from the normalization statistics), the graphs
laid out over the mesh, and the model (graphdef and parameters). `assemble`
builds them, in that order, and returns them together; how a run then uses
them (a training loop, a streamed rollout, an ahead-of-time compile) is the
caller's. A training run and a forecast open what they read the same way
(`run_data.open_run_data`) and assemble it with `assemble_run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, ContextManager

import jax
import numpy as np
import xarray as xr
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from wnscale.data.reading import normalization
from wnscale.data.run_data import RunData
from wnscale.errors import UserError
from wnscale.graphs.build import Graphs
from wnscale.graphs.points import PointSet
from wnscale.model import forecast, setup
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding.layout import ShardedLayout
from wnscale.specs import Specs


@dataclasses.dataclass(frozen=True)
class Assembly:
  """A config's model on a grid and a mesh (`assemble`).

  Attributes:
    graphs: the model's graphs on the grid.
    constants: host (numpy) `forecast.Constants` of the grid.
    layout: the graphs partitioned over the mesh's `graph` axis.
    graphdef: the model's `nnx` graph definition (None: assembled without a model).
    params: the parameters: initialized (`assemble(..., params="init")`), or
      `jax.ShapeDtypeStruct`s replicated on the mesh (to restore onto, or to
      compile for); None without a model.
    normalization: the statistics' `Normalization`; None when assembled
      without statistics (the residual scale is then 1).
  """

  graphs: Graphs
  constants: forecast.Constants
  layout: ShardedLayout
  graphdef: object
  params: object
  normalization: normalization.Normalization | None

  @property
  def replicated(self) -> jax.sharding.NamedSharding:
    """The sharding of parameters and optimizer state: whole on every device."""
    return self.layout.sharding(P())

  @property
  def abstract_params(self):
    """`jax.ShapeDtypeStruct`s of the parameters, replicated on the mesh."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=self.replicated), self.params)


def _silent(_: str) -> ContextManager[dict]:
  return contextlib.nullcontext({})


def assemble(specs: Specs, points: PointSet,
             stats: xr.Dataset | normalization.Normalization | None, mesh: Mesh, *,
             params: str | None = "shapes",
             phase: Callable[[str], ContextManager[dict]] = _silent,
             point_sets: dict[str, PointSet] | None = None,
             point_stats: dict | None = None) -> Assembly:
  """The graphs, constants, layout and model of an experiment (`specs.from_config` of its
  validated config) on `points` and `mesh`.

  Args:
    points: where the model runs: the grid's points (a store's `points`).
    stats: the run's normalization statistics (`normalization.py` format), or their
      `normalization.Normalization` already made (`run_data.RunData`'s); None: a residual
      scale of 1 (enough for shapes and compiles).
    mesh: the `(data, graph)` mesh.
    params: "init": the parameters initialized (from `config.seed`); "shapes":
      abstract (`Assembly.params`); None: no model (graphdef and parameters
      None: e.g. the planner's, whose remat settings are chosen per compile).
    phase: `phase(what)`, a context manager around each step worth a log
      line (e.g. `train.run_log.phase`), whose yielded dict takes a `"text"`.
    point_sets: each of `data.modalities`' points by name (e.g. its stations).
    point_stats: each target modality's normalization of its targets by name,
      `{"mean", "std"}` `[C_t]` (`observations.ModalityReader.stats["targets"]`); needed
      with `stats` (its first guess is the grid's state in its units).
  """
  point_sets = point_sets or {}
  missing = [m.name for m in specs.data.modalities if m.name not in point_sets]
  if missing:
    raise UserError(f"data.modalities {missing}: no points for them; training, forecasts "
                    "and the planner read observation stores, GraphCast example predictions "
                    "do not yet.")
  graphs = setup.graphs_for_grid(specs.model, points, modalities=specs.data.modalities,
                                 point_sets=point_sets)  # logs built or from cache
  norm = (normalization.Normalization.from_stats(specs.data, stats)
          if isinstance(stats, xr.Dataset) else stats)
  residual_scale = (np.ones(len(specs.data.output_channels), np.float32)
                    if norm is None else norm.residual_scale)
  lacking = [m.name for m in specs.data.modalities
             if m.targets and norm is not None and m.name not in (point_stats or {})]
  if lacking:
    raise ValueError(f"Target modalities {lacking} need their statistics (point_stats).")
  constants = setup.make_constants(
      specs.data, graphs, points, residual_scale, specs.train.variable_loss_weights,
      point_sets, None if norm is None else (norm.mean, norm.std), point_stats)
  shards = mesh.shape[mesh_lib.GRAPH]
  with phase(f"Partitioned the graphs over {shards} graph shard(s) ({mesh.shape[mesh_lib.DATA]} "
             f"data x {shards} graph devices)"):
    layout = ShardedLayout(mesh, graphs, setup.node_positions(specs.model, points, point_sets),
                           specs.mesh.exchange, specs.model)
  graphdef = model_params = None
  if params == "init":
    with phase("Initialized the model") as details:
      graphdef, model_params = setup.init_model(specs)
      details["text"] = f"{sum(x.size for x in jax.tree.leaves(model_params)):,} parameters"
  elif params == "shapes":
    graphdef, shapes = setup.init_model_shapes(specs)
    model_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=layout.sharding(P())), shapes)
  elif params is not None:
    raise ValueError(f"params={params!r}: 'init', 'shapes' or None")
  return Assembly(graphs, constants, layout, graphdef, model_params, norm)


def assemble_run(specs: Specs, data: RunData, mesh: Mesh, **kwargs) -> Assembly:
  """`assemble` on the grid store's points, normalized with the run's statistics, with each
  modality's points and target statistics from its reader (`run_data.open_run_data`).
  `kwargs`: `assemble`'s `params` and `phase`."""
  return assemble(specs, data.store.points, data.normalization, mesh,
                  point_sets={reader.name: reader.points for reader in data.readers},
                  point_stats={reader.name: reader.stats["targets"] for reader in data.readers},
                  **kwargs)
