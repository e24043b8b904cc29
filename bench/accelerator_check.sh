#!/usr/bin/env bash
# A prepared accelerator check (bench/accelerator_check.py says what it runs and records).
#
#   bash bench/accelerator_check.sh --prepare [--python=3.11] [--reference=GRAPHCAST_CHECKOUT]
#                                             [--from_index=NAME,...]
#       Here, where the package registry is reachable: downloads, into .accelerator/wheels/,
#       wheels of what the check imports (CHECKED below, at pyproject.toml's versions, and
#       the reference GraphCast's packages) with their dependencies, for that Python on
#       x86-64 Linux, less the image's own JAX, jaxlib, NumPy and SciPy. --from_index: these
#       are left out, to be installed from the accelerator machine's own package index
#       (ACCELERATOR_INDEX_URL at the run), e.g. large ones where what can be carried is
#       limited. With --reference, copies the reference's `graphcast/` package
#       (google-deepmind/graphcast, the classic package) into .accelerator/reference/.
#       Carry .accelerator/ to the accelerator's machine.
#   bash bench/accelerator_check.sh OUT [--cpu] [accelerator_check.py's flags]
#       On the accelerator's machine (no registry needed): installs those wheels without
#       their dependencies beside the image's JAX (under a temporary folder, last on
#       PYTHONPATH, so the image's JAX stays first), then runs every step into OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=.accelerator
# What the check's steps import, beyond the image's JAX stack (names as in pyproject.toml).
CHECKED="flax optax orbax-checkpoint grain tensorstore xarray h5netcdf zarr absl-py ml-collections tensorboardX etils matplotlib"
REFERENCE="dm-haiku jraph trimesh rtree chex dm-tree"

if [[ "${1:-}" == "--prepare" ]]; then
  shift
  python_version=3.11
  reference=""
  from_index=""
  for arg in "$@"; do
    case "$arg" in
      --python=*) python_version="${arg#--python=}" ;;
      --reference=*) reference="${arg#--reference=}" ;;
      --from_index=*) from_index="${arg#--from_index=}" ;;
      *) echo "accelerator_check.sh --prepare: unknown flag $arg" >&2; exit 2 ;;
    esac
  done
  rm -rf "$HERE/wheels" && mkdir -p "$HERE/wheels"
  # CHECKED with pyproject.toml's version bounds, and the reference's packages.
  python - "$CHECKED" "$REFERENCE" > "$HERE/requirements.txt" <<'PY'
import re, sys, tomllib
wanted = sys.argv[1].split()
for requirement in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
  if re.split(r"[\[<>=!~ ]", requirement)[0] in wanted:
    print(requirement)
print("\n".join(sys.argv[2].split()))
PY
  python -m pip download --quiet --only-binary=:all: --python-version "$python_version" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      -d "$HERE/wheels" -r "$HERE/requirements.txt"
  # The image's own JAX stack, and what its index is to install.
  for name in jax jaxlib numpy scipy ml_dtypes ${from_index//,/ }; do
    rm -f "$HERE/wheels/${name//-/_}"-[0-9]*.whl "$HERE/wheels/$name"-[0-9]*.whl
  done
  rm -f "$HERE"/wheels/nvidia_*.whl "$HERE"/wheels/jax_cuda*.whl
  git describe --always --dirty > "$HERE/commit.txt"  # the machine gets no .git
  rm -f "$HERE/from_index.txt"
  [[ -z "$from_index" ]] || echo "${from_index//,/ }" > "$HERE/from_index.txt"
  if [[ -n "$reference" ]]; then
    rm -rf "$HERE/reference" && mkdir -p "$HERE/reference"
    cp -r "$reference/graphcast" "$HERE/reference/"
  fi
  echo "$(ls "$HERE/wheels" | wc -l) wheels ($(du -sh "$HERE/wheels" | cut -f1)) in $HERE/wheels$([[ -n "$reference" ]] && echo ", the reference in $HERE/reference")"
  exit 0
fi

if [[ $# -lt 1 ]]; then
  echo "usage: bash bench/accelerator_check.sh OUT [--cpu] | --prepare [--python=X.Y] [--reference=DIR] [--from_index=NAMES]" >&2
  exit 2
fi
# The carried wheels, on the accelerator's machine (a --cpu run uses this environment).
# Installed once into .accelerator_site/ (beside .accelerator/, so that carrying that
# again leaves it), reused by the next run on the same machine while the wheels are alike.
if [[ -d "$HERE/wheels" && " $* " != *" --cpu "* ]]; then
  site="$PWD/.accelerator_site"
  stamp="$(ls "$HERE/wheels"; cat "$HERE/from_index.txt" 2>/dev/null || true)"
  if [[ "$(cat "$site/.installed" 2>/dev/null || true)" != "$stamp" ]]; then
    rm -rf "$site" && mkdir -p "$site"
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated --quiet --no-index --no-deps \
        --no-compile --no-cache-dir --target "$site" "$HERE"/wheels/*.whl
    if [[ -s "$HERE/from_index.txt" ]]; then
      PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated --quiet --no-deps \
          --only-binary=:all: --no-compile --no-cache-dir --target "$site" \
          --index-url "${ACCELERATOR_INDEX_URL:?set it to the package index of the machine, for $(cat "$HERE/from_index.txt")}" \
          $(cat "$HERE/from_index.txt")
    fi
    echo "$stamp" > "$site/.installed"
  fi
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
fi
if [[ -d "$HERE/reference" ]]; then
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/$HERE/reference"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # wnscale from this checkout
export PYTHONUNBUFFERED=1
exec python3 bench/accelerator_check.py "$@"
