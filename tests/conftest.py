"""Test setup: 8 fake CPU devices, set before jax is imported anywhere."""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
# With libtpu installed (TPU AOT tests): quiet its start-up, allow several processes.
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# 8 fake devices for sharding tests; the sequential scheduler makes memory_analysis
# reflect rematerialization (see shared JAX notes, section 3).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8"
    + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
    # Tests compile many small programs: cheap LLVM passes cut compile time ~4x.
    + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
)
# Keep the on-disk graph cache inside the test session, never the user's cache.
os.environ.setdefault("WNSCALE_CACHE_DIR",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".cache", "test")))

import absl.flags  # noqa: E402

# Grain reads absl flags in its workers; outside absl.app.run they must be parsed.
absl.flags.FLAGS.mark_as_parsed()
