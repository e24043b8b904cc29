"""Which pages of a file the operating system's page cache holds (Linux `mincore`)."""

import ctypes
import mmap
import os

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_LIBC.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_LIBC.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def cached_pages(path) -> int:
  """How many pages of the file at `path` are in the page cache (mapping it reads none)."""
  size = os.path.getsize(path)
  if size == 0:
    return 0
  descriptor = os.open(path, os.O_RDONLY)
  try:
    address = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, 0)
    if address == ctypes.c_void_p(-1).value:
      raise OSError(ctypes.get_errno(), f"mmap of {path}")
    try:
      pages = -(-size // mmap.PAGESIZE)
      residency = (ctypes.c_ubyte * pages)()
      if _LIBC.mincore(address, size, residency) != 0:
        raise OSError(ctypes.get_errno(), f"mincore of {path}")
      return sum(byte & 1 for byte in residency)
    finally:
      _LIBC.munmap(address, size)
  finally:
    os.close(descriptor)


def evicts(directory) -> bool:
  """Whether the filesystem of `directory` keeps written files in the page cache and drops
  them when asked (not tmpfs, whose pages are the files)."""
  probe = os.path.join(directory, "page_cache_probe")
  with open(probe, "wb") as file:
    file.write(b"x" * 3 * mmap.PAGESIZE)
    file.flush()
    os.fsync(file.fileno())
  try:
    if cached_pages(probe) == 0:
      return False
    descriptor = os.open(probe, os.O_RDONLY)
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(descriptor)
    return cached_pages(probe) == 0
  finally:
    os.remove(probe)


def cached_chunks(store, names) -> list[str]:
  """The chunk files of the zarr v2 store's variables `names` with pages in the page cache."""
  chunks = [os.path.join(store, name, key) for name in names
            for key in os.listdir(os.path.join(store, name)) if not key.startswith(".")]
  assert chunks, f"no chunk of {names} in {store}"
  return [path for path in chunks if cached_pages(path)]
