"""Values that vary over `shard_map`'s manual mesh axes, and making types agree.

Inside `shard_map` (with its type check on), every value is typed by the mesh
axes it varies over: a parameter replicated on every device varies over none,
a shard's latents over `data` and `graph`. Where the two meet, JAX inserts the
cast from invariant to varying itself, and its gradient is the `psum` that
reduces a replicated parameter's gradient. Code that builds its own gradient
(a `jax.custom_vjp`) or its own loop carry has to make the types agree first.
Outside `shard_map` everything here is the identity.
"""

from __future__ import annotations

import jax


def varying_axes(x) -> frozenset:
  """The manual mesh axes `x` varies over (empty outside `shard_map`)."""
  manual = getattr(jax.typeof(x), "manual_axis_type", None)
  return getattr(manual, "varying", frozenset())


def vary_like(x: jax.Array, *references: jax.Array) -> jax.Array:
  """`x`, marked as varying over every manual mesh axis that `references` vary over.

  E.g. a scan carry computed from graph constants alone (varying over `graph`)
  that joins per-example latents (varying over `data` too) must keep one type.
  """
  missing = frozenset().union(*map(varying_axes, references)) - varying_axes(x)
  return jax.lax.pcast(x, tuple(sorted(missing)), to="varying") if missing else x


def summed(tree):
  """Each array of `tree` summed over the manual mesh axes it varies over: one that varies
  over none (a replicated parameter's gradient, which JAX has summed already) as it is."""
  return jax.tree.map(lambda x: jax.lax.psum(x, tuple(sorted(varying_axes(x)))), tree)
